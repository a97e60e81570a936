#!/usr/bin/env bash
# A one-node SLURM cluster (Debian's slurm-wlm + munge) in a folder of its own, for tests and for
# trying hydra/launcher=submitit_slurm on one machine. No systemd is needed: the daemons run in the
# background with their state, sockets, logs and ports under DIR, so nothing system-wide is touched
# and two clusters can coexist.
#   scripts/slurm_cluster.sh start DIR   # prints SLURM_CONF=...; export it for sbatch/squeue/prunebench
#   scripts/slurm_cluster.sh stop DIR    # stops the daemons by their PIDs
# Installs slurm-wlm and munge with apt-get when they are missing and this runs as root.
set -euo pipefail
cmd=${1:?usage: slurm_cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: slurm_cluster.sh start|stop DIR}")

stop() {
  # jobs first, while slurmd still runs: a job step orphaned by a stopped slurmd never ends
  if [ -s "$dir"/slurm.conf ] && [ -s "$dir"/slurmctld.pid ]; then
    export SLURM_CONF="$dir"/slurm.conf
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    [ -z "$jobs" ] || scancel $jobs 2>/dev/null || true
    # until slurmd has no job process left (squeue forgets a job before its steps are gone)
    for _ in $(seq 300); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && [ "$(scontrol listpids 2>/dev/null | wc -l)" -le 1 ] && break
      sleep 0.1
    done
  fi
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munge/munged.pid; do
    if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munge/munged.pid; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$pidfile"
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: slurm_cluster.sh start|stop DIR" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >&2
  else
    echo "slurm_cluster.sh: slurmctld/munged are not installed (apt-get install slurm-wlm munge, as root)" >&2
    exit 3
  fi
fi
[ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: slurmd must run as root" >&2; exit 3; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
rm -rf "$dir" && mkdir -p "$dir"/state "$dir"/spool "$dir"/munge
chmod 755 "$dir"
# munge: its own key and socket in DIR, run as the munge user as Debian's service would
chown munge:munge "$dir"/munge && chmod 711 "$dir"/munge  # clients reach the socket, not the key
dd if=/dev/urandom of="$dir"/munge/munge.key bs=1024 count=1 status=none
chown munge:munge "$dir"/munge/munge.key && chmod 400 "$dir"/munge/munge.key
setpriv --reuid=munge --regid=munge --init-groups munged --key-file="$dir"/munge/munge.key \
  --socket="$dir"/munge/munge.socket --pid-file="$dir"/munge/munged.pid --log-file="$dir"/munge/munged.log \
  --seed-file="$dir"/munge/munged.seed
for _ in $(seq 100); do [ -S "$dir"/munge/munge.socket ] && break; sleep 0.1; done

cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
cat > "$dir"/slurm.conf <<EOF
ClusterName=prunebench
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# a test cluster: the declared CPUs are slots, more than the cores, so several tiny jobs run at once
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# scancel and requeue: SIGTERM, then SIGKILL after 30 s, SLURM's default: a job ends its run KILLED on
# SIGTERM, which can take more than 5 s on a slow machine whose store is busy
KillWait=30
NodeName=$host CPUs=$((cpus * 2)) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir"/slurm.conf
slurmctld -D -f "$SLURM_CONF" > "$dir"/slurmctld.out 2>&1 &
slurmd -D -f "$SLURM_CONF" > "$dir"/slurmd.out 2>&1 &
for _ in $(seq 300); do
  [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.1
done
echo "slurm_cluster.sh: the node did not become idle; logs in $dir" >&2
tail -n 20 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 || true
stop
exit 1
