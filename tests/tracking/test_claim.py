"""Run-key claims between real worker processes: one runs a key, a second waits for it, a dead or
silent holder is taken over, and a key ends with one FINISHED run and nothing left RUNNING.

The workers are paused (SIGSTOP) or killed (SIGKILL) once their claim is in the store and their job
has begun (its parameters logged), at the same look, while the test holds the store's write lock: a
job cannot end its run first, however fast, and a paused worker holds no lock the others wait on.
Each interleaving is forced, and every wait is on a condition (a run's state, a log line, a process
stopped), never on a wall-clock margin. A worker that takes a dead or silent holder's claim over runs
in this process: what is tested is the claim, not how that worker was started."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from mlflow.tracking import MlflowClient

from conftest import TINY_MC, compose_cfg, pause_process
from prunebench.job import run
from prunebench.tracking import claim
from prunebench.tracking.store import prepare_sqlite

SRC = str(Path(__file__).resolve().parents[2] / "src")
JOB = [*TINY_MC, "pruner=none", "tracking.claim.heartbeat_s=0.2"]
HANG_GUARD_S = 300  # only a broken build gets here: the workers below take seconds


def worker(*overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "prunebench", *JOB, *overrides], env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def key_runs(uri: str):
    prepare_sqlite(uri)  # as prunebench's processes do: a fresh file's first opens must take turns
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("prunebench")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def at_claim(proc: subprocess.Popen, uri: str, act: Callable[[subprocess.Popen], None]) -> str:
    """`act(proc)` (pause it, kill it) once its job has begun, and the claimed run's id. Its parameters
    are logged after the claim is settled (`claim.acquire`), so the holder is past the claim's own
    checks. The look and the act happen while the test holds the store's write lock: a tiny job
    cannot end its run in between (ending is a write), and the worker is then between writes (or
    waiting for the lock, which holds nothing), so a paused worker blocks no other's writes."""
    key_runs(uri)  # MLflow's first open of the file, outside the lock
    deadline = time.monotonic() + HANG_GUARD_S
    with closing(sqlite3.connect(uri[len("sqlite:///"):], timeout=HANG_GUARD_S, isolation_level=None)) as db:
        while time.monotonic() < deadline:
            db.execute("BEGIN IMMEDIATE")  # waits for a write of the worker in progress to commit
            try:
                running = [r for r in key_runs(uri) if r.info.status == "RUNNING" and r.data.params]
                if running:
                    act(proc)
                    return running[0].info.run_id
            finally:
                db.execute("ROLLBACK")
            assert proc.poll() is None, f"the worker ended (rc {proc.returncode}) without claiming its key"
            time.sleep(0.2)
    raise AssertionError("the first worker never claimed its key")


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def read_until(proc: subprocess.Popen, text: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"worker exited (rc {proc.wait()}) without logging {text!r}:\n{''.join(lines)[-4000:]}")


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, out[-4000:]
    return out


def statuses(uri: str) -> list[str]:
    return sorted(r.info.status for r in key_runs(uri))


def test_a_second_worker_waits_for_the_live_holder_then_skips(store):
    first = worker()
    at_claim(first, store, pause_process)  # holds the claim, heartbeat fresh enough (stale_s is 300)
    second = worker()
    try:
        read_until(second, "waiting for it")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    finish(first)
    assert "another worker FINISHED run key" in finish(second)
    assert statuses(store) == ["FINISHED"]


def test_a_requeued_job_takes_over_its_own_dead_attempt_at_once(store, monkeypatch):
    slurm = {"SLURM_JOB_ID": "4242"}
    first = worker(env=slurm)
    killed = at_claim(first, store, kill)
    # the next attempt in this process (the claim is what is tested, not its process); stale_s is 300:
    # only the same job id can tell the claim is dead
    monkeypatch.setenv("SLURM_JOB_ID", slurm["SLURM_JOB_ID"])
    run(compose_cfg(JOB))
    runs = {r.info.run_id: r for r in key_runs(store)}
    assert sorted(r.info.status for r in runs.values()) == ["FINISHED", "KILLED"]
    assert "an earlier attempt of this job (slurm:4242)" in runs[killed].data.tags["prunebench.error"]
    (new,) = [r for r in runs.values() if r.info.status == "FINISHED"]
    assert new.data.tags[claim.ATTEMPT_TAG] == "2"


def test_a_silent_holder_is_taken_over_and_does_not_finish_when_it_wakes(store):
    first = worker()
    silent = at_claim(first, store, pause_process)  # its heartbeat stops with it
    try:
        # in this process: waits while the paused holder's last beat is under 1 s old, then takes the claim over
        run(compose_cfg([*JOB, "tracking.claim.stale_s=1"]))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert "not recorded FINISHED, the claim was taken over" in finish(first)
    runs = {r.info.run_id: r for r in key_runs(store)}
    assert sorted(r.info.status for r in runs.values()) == ["FINISHED", "KILLED"]
    assert runs[silent].info.status == "KILLED"
    assert "no heartbeat for" in runs[silent].data.tags["prunebench.error"]


def fake_run(worker_tag: str, beat: float):
    return SimpleNamespace(data=SimpleNamespace(tags={claim.WORKER_TAG: worker_tag, claim.HEARTBEAT_TAG: str(beat)}),
                           info=SimpleNamespace(start_time=int(beat * 1000)))


def test_holder_gone_knows_dead_local_processes_and_trusts_heartbeats_elsewhere():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, now = socket.gethostname(), time.time()
    assert "has exited" in claim.holder_gone(fake_run(f"{host}:{done.stdout.strip()}", now), "me", 300)
    assert claim.holder_gone(fake_run(f"{host}:{os.getpid()}", now), "me", 300) is None
    assert claim.holder_gone(fake_run("elsewhere:1", now), "me", 300) is None
    assert "no heartbeat" in claim.holder_gone(fake_run("elsewhere:1", now - 301), "me", 300)
    assert "earlier attempt" in claim.holder_gone(fake_run("slurm:7", now), "slurm:7", 300)


def test_a_claimant_taken_over_before_its_own_check_looks_again(store, monkeypatch):
    """A worker stalled (paused, swapped out) between creating its claim and checking it, longer
    than stale_s: another worker ended the claim KILLED and finished the key meanwhile."""
    client = MlflowClient(store)
    prepare_sqlite(store)
    exp = client.create_experiment("claims")
    key_tags = {"prunebench.run_key": "k"}
    real = claim.key_runs
    calls = []

    def key_runs(client_, exp_id, key):
        calls.append(key)
        if len(calls) == 2:  # the claimant's own check, right after it created its run
            (mine,) = real(client_, exp_id, key)
            client_.set_terminated(mine.info.run_id, "KILLED")
            other = client_.create_run(exp_id, tags={**key_tags, claim.WORKER_TAG: "elsewhere:1"})
            client_.set_terminated(other.info.run_id, "FINISHED")
        return real(client_, exp_id, key)

    monkeypatch.setattr(claim, "key_runs", key_runs)
    settings = SimpleNamespace(heartbeat_s=0.01, stale_s=300)
    assert claim.acquire(store, exp, "k", "job", key_tags, settings, skip_finished=True) is None
    assert sorted(r.info.status for r in real(client, exp, "k")) == ["FINISHED", "KILLED"]
