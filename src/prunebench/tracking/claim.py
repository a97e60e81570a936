"""A job claims its run key before the model loads, so two workers that start the same key (two
sweeps overlapping, an array task retried) run it once, and a claim whose worker died is taken over.

The claim is the job's own MLflow run, RUNNING, tagged with the worker holding it and a heartbeat that
a background thread refreshes; it works the same on a SQLite file and on a tracking server. MLflow has
no compare-and-set, so claimants that create their runs at the same moment settle by an order each of
them computes alike (start time, then run id): the first claim wins, the others delete their run and
wait for it. Two claims can miss each other by a few milliseconds, so the order is checked once more
before a run ends FINISHED: of two overlapping runs of one key only the first is kept."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from prunebench.tracking.store import KEY_TAG, set_shared_tag

log = logging.getLogger(__name__)
WORKER_TAG = "prunebench.worker"
HEARTBEAT_TAG = "prunebench.heartbeat"
ATTEMPT_TAG = "prunebench.attempt"
# the states in which SLURM may still run (or run again) a job's process
SLURM_ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
               "CONFIGURING", "COMPLETING", "STOPPED", "SIGNALING"}


def worker_id() -> str:
    """A SLURM job keeps its id when it is requeued, so a claim under this job's id is an earlier,
    dead attempt of this very job. An array task is named as squeue and scancel name it (1234_5):
    its own job number means nothing to them."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")
    return f"slurm:{job}" if job else f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def slurm_states(job: str) -> dict[str, str] | None:
    """SLURM's word on a job, or on each task of an array job (`-r`: one line per task), by the id
    squeue prints (1234_5); None where squeue cannot say (no SLURM on this host). A job SLURM no
    longer lists (or refuses as invalid) has ended: it is absent from the answer. `-t all`: an ended
    job is named as ended (CANCELLED, COMPLETED) for as long as SLURM remembers it."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i %T"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def sacct_states(job: str) -> dict[str, str]:
    """SLURM's accounting of a job's (or an array's) tasks, kept after squeue forgets them; {} where
    accounting is off or absent."""
    if shutil.which("sacct") is None:
        return {}
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # "CANCELLED by 0": the state is the first word
    return {task: state.split()[0] for task, _, state in (line.partition("|") for line in out.stdout.splitlines())
            if state} if out.returncode == 0 else {}


def _slurm_state(job: str) -> str | None:
    states = slurm_states(job)
    return None if states is None else states.get(job, "GONE")


def worker_gone(worker: str) -> str | None:
    """Why a worker (`worker_id()`'s value) is certainly gone, where this host can tell at once (a
    process of this host, squeue); None while it may be alive or nothing here can say."""
    host, _, ident = worker.rpartition(":")
    if host == socket.gethostname() and ident.isdigit() and not _pid_alive(int(ident)):
        return f"its process {ident} on this host has exited"
    if host == "slurm":
        state = _slurm_state(ident)
        if state is not None and state not in SLURM_ALIVE:
            return f"SLURM job {ident} is {state}"
    return None


def holder_gone(run, me: str, stale_s: float) -> str | None:
    """Why the worker holding this claim is certainly gone, or None while it may be alive. Where the
    host can tell (same worker id, a local process, squeue), that is known at once; elsewhere only a
    heartbeat older than `stale_s` tells."""
    worker = run.data.tags.get(WORKER_TAG, "")
    if worker == me:
        return f"an earlier attempt of this job ({me}) was interrupted"
    if reason := worker_gone(worker):
        return reason
    beat = float(run.data.tags.get(HEARTBEAT_TAG, run.info.start_time / 1000))
    if time.time() - beat > stale_s:
        return f"no heartbeat for {time.time() - beat:.0f} s (stale after {stale_s:g} s)"
    return None


def end_if_gone(client: MlflowClient, run, me: str, stale_s: float) -> str | None:
    """Ends a RUNNING run KILLED, with the reason, when its worker is gone."""
    reason = holder_gone(run, me, stale_s)
    if reason:
        log.warning("run %s (%s) was left RUNNING: %s; ending it KILLED", run.info.run_id,
                    run.data.tags.get("mlflow.runName", "?"), reason)
        set_shared_tag(client, run.info.run_id, "prunebench.error", f"ended KILLED by {me}: {reason}")
        client.set_terminated(run.info.run_id, "KILLED")
    return reason


def _order(run) -> tuple[int, str]:
    return run.info.start_time, run.info.run_id


@dataclass
class Claim:
    client: MlflowClient
    exp_id: str
    key: str
    run_id: str
    heartbeat_s: float

    def key_runs(self):
        return key_runs(self.client, self.exp_id, self.key)

    @contextmanager
    def heartbeat(self):
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                try:
                    self.client.set_tag(self.run_id, HEARTBEAT_TAG, f"{time.time():.0f}")
                except Exception as err:  # a missed beat is retried; only a long silence loses the claim
                    log.warning("heartbeat of run %s failed: %s", self.run_id, err)

        thread = threading.Thread(target=beat, name="prunebench-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def lost_to(self) -> tuple[str, bool] | None:
        """(why this run must not end FINISHED, whether it duplicates another run): it was taken
        over, or another run of its key that overlapped it in time comes first in the claim order."""
        runs = self.key_runs()
        mine = next((r for r in runs if r.info.run_id == self.run_id), None)
        if mine is None or mine.info.status != "RUNNING":
            return f"the claim was taken over (status {mine.info.status if mine else 'deleted'})", False
        for other in runs:
            overlapped = other.info.status == "RUNNING" or (
                other.info.status == "FINISHED" and (other.info.end_time or 0) >= mine.info.start_time)
            if other.info.run_id != self.run_id and overlapped and _order(other) < _order(mine):
                return f"run {other.info.run_id} of the same key came first", True
        return None


def key_runs(client: MlflowClient, exp_id: str, key: str):
    return client.search_runs([exp_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1000)


def acquire(uri: str, exp_id: str, key: str, run_name: str, tags: dict[str, str], settings,
            skip_finished: bool) -> Claim | None:
    """Blocks while a live worker holds the key; None when, meanwhile, the key got a FINISHED run
    (and `skip_finished`). Dead holders are ended KILLED with the reason, never left RUNNING."""
    client = MlflowClient(uri)
    me = worker_id()
    waiting_for = None
    while True:
        runs = key_runs(client, exp_id, key)
        if skip_finished and any(r.info.status == "FINISHED" for r in runs):
            return None
        live = []
        for other in (r for r in runs if r.info.status == "RUNNING"):
            if not end_if_gone(client, other, me, settings.stale_s):
                live.append(other)
        if not live:
            # every earlier run of the key that did not finish (the RUNNING ones were just taken over)
            attempt = 1 + sum(r.info.status != "FINISHED" for r in runs)
            run = client.create_run(exp_id, run_name=run_name, tags={
                **tags, WORKER_TAG: me, HEARTBEAT_TAG: f"{time.time():.0f}", ATTEMPT_TAG: str(attempt)})
            claim = Claim(client, exp_id, key, run.info.run_id, settings.heartbeat_s)
            first = min((r for r in claim.key_runs() if r.info.status == "RUNNING"), key=_order, default=None)
            if first is None:  # this worker stalled past stale_s before its check and was taken over: look again
                continue
            if first.info.run_id == run.info.run_id:
                return claim
            client.delete_run(run.info.run_id)  # a claim created at the same moment came first
            live = [first]
        if waiting_for != live[0].info.run_id:
            waiting_for = live[0].info.run_id
            log.info("run key %s is being run by %s (run %s): waiting for it", key,
                     live[0].data.tags.get(WORKER_TAG, "?"), waiting_for)
        time.sleep(settings.heartbeat_s)
