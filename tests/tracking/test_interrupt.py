"""Sweeps interrupted by real signals leave a true record: the jobs a dead process ran end KILLED,
the parent closes with the real counts once no cell is alive (by `prunebench-status`, or by the next
sweep in the experiment), and a cell never started is shown `left`, never `running` with an ETA.

A sweep is killed mid-job as tests/test_claim.py kills a worker: once a job's run is in the store with
its parameters, while the test holds the store's write lock, so the job cannot end first. To reach one
phase of a job (launch, load, score, recovery, evaluation, logging) and no other, the sweep runs under
helpers/paused_sweep.py, which holds it there until the signal comes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import TINY_MC
from prunebench.tracking.status import main as status
from prunebench.tracking.store import prepare_sqlite

pytestmark = pytest.mark.process
SRC = str(Path(__file__).resolve().parents[2] / "src")
GRID = [*TINY_MC, "pruner=magnitude", "tracking.ensure_dense=false", "tracking.claim.heartbeat_s=0.2"]
HANG_GUARD_S = 300


def as_from_a_terminal() -> None:
    """Ctrl-C reaches the sweep as from a terminal, also where the tests run as a background job of a
    non-interactive shell: its children start with SIGINT ignored, and Python keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_sweep(*overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "prunebench", "-m", *GRID, *overrides], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=as_from_a_terminal)


def runs(uri: str):
    prepare_sqlite(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("prunebench")
    return [] if exp is None else client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def kill_mid_job(proc: subprocess.Popen, uri: str, finished: int, grace_s: float | None = None) -> None:
    """SIGKILL once `finished` jobs have FINISHED and the next one's run is in the store, parameters
    logged; with `grace_s`, SIGINT first and SIGKILL that long after it (a scheduler's grace period)."""
    runs(uri)
    deadline = time.monotonic() + HANG_GUARD_S
    with closing(sqlite3.connect(uri[len("sqlite:///"):], timeout=HANG_GUARD_S, isolation_level=None)) as db:
        while time.monotonic() < deadline:
            db.execute("BEGIN IMMEDIATE")
            try:
                jobs = [r for r in runs(uri) if r.data.tags.get("prunebench.sweep") != "true"]
                if (sum(r.info.status == "FINISHED" for r in jobs) == finished
                        and any(r.info.status == "RUNNING" and r.data.params for r in jobs)):
                    if grace_s is None:
                        proc.kill()
                        proc.wait()
                        return
                    proc.send_signal(signal.SIGINT)
                    break
            finally:
                db.execute("ROLLBACK")
            assert proc.poll() is None, f"the sweep ended (rc {proc.returncode}) before the job to kill"
            # the lock is free only this long: a tiny job's evaluation (between its parameters and its
            # metrics, both writes) outlasts it on any machine, so the look finds it mid-job
            time.sleep(0.005)
        else:
            raise AssertionError("the sweep never reached the job to kill")
    time.sleep(grace_s)  # the lock released: the interrupted job unwinds meanwhile, as far as it gets
    proc.kill()
    proc.wait()


def sweeps(uri: str):
    return [r for r in runs(uri) if r.data.tags.get("prunebench.sweep") == "true"]


def status_rows(capsys, sweep: str = "latest") -> tuple[list[tuple[str, str]], str]:
    capsys.readouterr()
    assert status([sweep]) == 0
    out = capsys.readouterr().out
    return [tuple(line.split()[:2]) for line in out.splitlines() if line[:4].strip().isdigit()], out


def counts(run) -> dict[str, str]:
    return {k.removeprefix("prunebench.jobs_"): v for k, v in run.data.tags.items() if k.startswith("prunebench.jobs_")}


def test_sigkilled_sweep_is_closed_by_status_and_a_rerun_finishes_the_rest(store, capsys):
    grid = "sparsity=0.1,0.2,0.3"
    kill_mid_job(start_sweep(grid), store, finished=1)
    (parent,) = sweeps(store)
    assert parent.info.status == "RUNNING"  # nothing of the killed process could close it
    rows, out = status_rows(capsys)
    assert rows == [("0", "done"), ("1", "killed"), ("2", "left")], out
    assert "ETA" not in out, out
    assert "1 cell(s) never started: the same command again runs them" in out
    parent = MlflowClient(store).get_run(parent.info.run_id)
    assert parent.info.status == "FAILED"
    assert {k: counts(parent)[k] for k in ("finished", "killed", "left", "running")} == {
        "finished": "1", "killed": "1", "left": "1", "running": "0"}
    job_runs = [r for r in runs(store) if r.data.tags.get("prunebench.sweep") != "true"]
    assert sorted(r.info.status for r in job_runs) == ["FINISHED", "KILLED"]
    assert "has exited" in next(r for r in job_runs if r.info.status == "KILLED").data.tags["prunebench.error"]
    assert "closed FAILED (1 finished, 0 failed, 1 killed, 0 running, 0 retried, 1 left)" in out, out

    rerun = start_sweep(grid)
    out_rerun, _ = rerun.communicate(timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, out_rerun[-4000:]
    newest = sweeps(store)[-1]
    assert newest.info.status == "FINISHED" and counts(newest)["finished"] == "2" and counts(newest)["left"] == "0"
    rows, out = status_rows(capsys)
    assert rows == [("0", "done"), ("1", "done"), ("2", "done")], out
    assert "nothing left" in out and "closed FINISHED" in out
    rows, out = status_rows(capsys, parent.info.run_id)  # the killed sweep's record is unchanged
    assert rows == [("0", "done"), ("1", "killed"), ("2", "left")], out


@pytest.mark.parametrize("closer", ["rerun", "report"])
def test_the_next_sweep_or_report_closes_the_sweep_killed_before_it(store, tmp_path, closer):
    grid = "sparsity=0.1,0.2"
    kill_mid_job(start_sweep(grid), store, finished=0)
    if closer == "rerun":
        rerun = start_sweep(grid)
        out, _ = rerun.communicate(timeout=HANG_GUARD_S)
        assert rerun.returncode == 0, out[-4000:]
        killed, newest = sweeps(store)
        assert newest.info.status == "FINISHED" and counts(newest)["finished"] == "2"
    else:
        from prunebench.report.cli import main as report_main

        report_main(["--all", "--out", str(tmp_path / "report"), "--tracking-uri", store])
        (killed,) = sweeps(store)
    assert killed.info.status == "FAILED", killed.data.tags
    assert (counts(killed)["finished"], counts(killed)["killed"], counts(killed)["left"]) == ("0", "1", "1")
    assert not [r for r in runs(store) if r.info.status == "RUNNING"]


@pytest.mark.parametrize("after_s", [0.0, 0.5, 1.5])
def test_ctrl_c_at_launch_closes_the_parent_with_what_ran(store, capsys, after_s):
    proc = start_sweep("sparsity=0.1,0.2")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Launching" in line:
            break
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode != 0, "".join(lines) + out
    (parent,) = sweeps(store)
    assert parent.info.status == "FAILED", "".join(lines) + out  # never FINISHED with 0 jobs
    assert not [r for r in runs(store) if r.info.status == "RUNNING"]
    rows, text = status_rows(capsys)
    assert [state for _, state in rows] in (["killed", "left"], ["left", "left"]), text
    assert "ETA" not in text, text
    assert counts(parent)["left"] in ("1", "2") and int(counts(parent)["finished"]) == 0, counts(parent)


@pytest.mark.parametrize("grace_s", [0.0, 0.3, 1.0])
def test_ctrl_c_then_sigkill_mid_job_leaves_a_true_record(store, capsys, grace_s):
    """SIGINT, then SIGKILL as a scheduler's grace period ends: wherever the unwinding was cut, the
    next status shows the truth."""
    kill_mid_job(start_sweep("sparsity=0.1,0.2,0.3"), store, finished=1, grace_s=grace_s)
    rows, out = status_rows(capsys)
    assert rows == [("0", "done"), ("1", "killed"), ("2", "left")], out
    (parent,) = sweeps(store)
    assert parent.info.status == "FAILED" and counts(parent)["finished"] == "1", out
    assert (counts(parent)["killed"], counts(parent)["left"]) == ("1", "1"), counts(parent)
    assert not [r for r in runs(store) if r.info.status == "RUNNING"]


PAUSED_SWEEP = Path(__file__).resolve().parents[1] / "helpers" / "paused_sweep.py"
# what each phase needs to be reached: a cached scorer on calibration text, a recovery's training
PHASE_OVERRIDES = {"score": ["pruner=wanda", "pruner.sequential=false", "calib=file", "calib.n_samples=2",
                             "calib.seq_len=16"],
                   "recovery": ["recovery.max_steps=2"]}


# every phase once and every signal in more than one phase (not the 18 pairs: each is a sweep of its own):
# Ctrl-C where Lightning's loops catch it (recovery's fit, evaluation's test) and at launch, SIGKILL where
# nothing unwinds (load, evaluation, logging's writes), SIGTERM as a scheduler's first word (score, logging)
PHASE_SIGNALS = [("launch", signal.SIGINT), ("load", signal.SIGKILL), ("score", signal.SIGTERM),
                 ("recovery", signal.SIGINT), ("evaluation", signal.SIGINT), ("evaluation", signal.SIGKILL),
                 ("logging", signal.SIGTERM), ("logging", signal.SIGKILL)]


@pytest.mark.parametrize(("phase", "signum"), PHASE_SIGNALS, ids=[f"{p}-{s.name}" for p, s in PHASE_SIGNALS])
def test_a_signal_in_any_phase_of_a_job_leaves_a_true_record(store, tmp_path, capsys, phase, signum):
    """The first of two cells is held in `phase` (helpers/paused_sweep.py) and sent `signum`; then
    `prunebench-status`: no run RUNNING, the job's run KILLED (at launch it had none yet), its cell
    killed, the cell never started `left`, and the parent closed FAILED with those counts."""
    from helpers.recovery import TEXT, recovery_overrides

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40)
    extra = {"score": [*PHASE_OVERRIDES["score"], f"calib.path={text}"],
             "recovery": recovery_overrides(text, *PHASE_OVERRIDES["recovery"])}.get(phase, [])
    marker = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(PAUSED_SWEEP.parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(PAUSED_SWEEP), phase, str(marker), *GRID, *extra, "sparsity=0.1,0.2"],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists():
        assert proc.poll() is None, f"the sweep ended (rc {proc.returncode}) before {phase}: {proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"the sweep never reached {phase}"
        time.sleep(0.05)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode != 0, out[-4000:]
    rows, text_out = status_rows(capsys)
    assert "ETA" not in text_out, text_out
    (parent,) = sweeps(store)
    job_runs = [r for r in runs(store) if r.data.tags.get("prunebench.sweep") != "true"]
    assert [r.info.status for r in job_runs] == ([] if phase == "launch" else ["KILLED"]), out[-4000:]
    assert rows == [("0", "killed"), ("1", "left")], text_out + out[-4000:]  # launched, then killed: at launch too
    assert parent.info.status == "FAILED", text_out
    assert {k: counts(parent)[k] for k in ("finished", "killed", "left", "running")} == {
        "finished": "0", "killed": "1", "left": "1", "running": "0"}, text_out
