"""A detached sweep's closing and its cells' states, without SLURM: several processes that find the
last cell ended at once close the sweep exactly once; each combination of a job's own end and
SLURM's word reads as the state prunebench-status shows. tests/test_slurm.py runs it all on SLURM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from prunebench.tracking import cells, sweep
from prunebench.tracking.status import eta
from prunebench.tracking.store import experiment_id

SRC, TESTS = (str(Path(__file__).resolve().parents[1] / d) for d in ("src", "tests"))
CLOSERS = 4


def counting_report(experiment: str, run_id: str, out: Path) -> Path:
    """A sweep report that leaves a mark per call (the real one needs real runs)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "calls.txt", "a") as calls:
        calls.write(f"{os.getpid()}\n")
    (out / "results.md").write_text("report\n")
    return out


def test_cells_ending_at_once_close_the_sweep_exactly_once(store, tmp_path):
    client = MlflowClient(store)
    exp = experiment_id(store, "prunebench")
    parent = client.create_run(exp, tags={"prunebench.sweep": "true", sweep.DETACHED_TAG: "true",
                                          sweep.REPORT_TAG: "test_detach.counting_report", sweep.STALE_TAG: "300",
                                          sweep.SUBMITTED_TAG: "true",
                                          "hydra.sweep_dir": str(tmp_path / "sweep")}).info.run_id
    for num in range(3):  # three cells, each ended by its job: the sweep is over
        child = client.create_run(exp, tags={"mlflow.parentRunId": parent})
        client.set_terminated(child.info.run_id, "FINISHED")
        cells.job_tag(client, parent, num, {"state": "FINISHED", "worker": f"h:{num}", "start": 0.0, "end": 1.0})
    # the closers start together: each imports, says so, and waits for the word to go; then each finds
    # every cell ended, and all try to close (any interleaving must leave one winner, so starting
    # together only makes the contest likely, not the result)
    code = ("import sys; from prunebench.tracking.sweep import close_if_done; print('READY', flush=True); "
            f"sys.stdin.readline(); print('CLOSED' if close_if_done({store!r}, {parent!r}, 300) else 'NOT')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS, os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(CLOSERS)]
    for proc in procs:
        assert proc.stdout.readline() == "READY\n", proc.communicate(timeout=300)[1][-2000:]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [p.communicate(timeout=300) for p in procs]
    verdicts = [out.strip().splitlines()[-1] if out.strip() else err[-2000:] for out, err in outs]
    assert sorted(verdicts) == ["CLOSED"] + ["NOT"] * (CLOSERS - 1), verdicts
    assert len((tmp_path / "sweep" / "calls.txt").read_text().split()) == 1  # one report
    run = client.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["prunebench.jobs_finished"] == "3"
    assert run.data.params[sweep.CLOSER_PARAM]
    assert {a.path for a in client.list_artifacts(parent, "report")} == {"report/results.md"}
    assert not sweep.close_if_done(store, parent, 300)  # a closed sweep stays closed


def judged(job: dict | None, word: str | None, slurm: bool = True) -> cells.Cell:
    cell = cells.Cell(0, slurm="7_0" if slurm else None, job=job or {})
    cells.judge(cell, None if word is None else ({} if word == "GONE" else {"7_0": word}), None, 300, submitted=True)
    return cell


def test_a_cells_state_from_its_jobs_end_and_slurms_word():
    now = time.time()
    running = {"state": "RUNNING", "worker": "slurm:7_0", "start": now}
    killed = {**running, "state": "KILLED", "end": now}
    assert judged({**running, "state": "FINISHED", "end": now + 12}, "GONE").state == "done"
    assert judged({**running, "state": "FINISHED", "end": now + 12}, "GONE").duration_s == 12
    failed = judged({**running, "state": "FAILED", "error": "ValueError: bad\nmore"}, "GONE")
    assert (failed.state, failed.detail) == ("failed", "ValueError: bad")
    assert (judged(None, "PENDING").state, judged(None, "RUNNING").state) == ("waiting", "running")
    cancelled = judged(killed, "CANCELLED")
    assert (cancelled.state, cancelled.ended) == ("killed", True) and "stopped by a signal" in cancelled.detail
    requeued = judged(killed, "PENDING")
    assert (requeued.state, requeued.ended) == ("waiting", False) and "requeued" in requeued.detail
    outright = judged(running, "GONE")  # SIGKILL, a lost node: the job wrote no end
    assert (outright.state, outright.ended) == ("killed", True) and "ended without a word" in outright.detail
    assert judged(None, "GONE").detail.endswith("never started")  # cancelled while pending
    assert judged(running, "COMPLETING").ended is False
    # a host without squeue cannot tell a requeue from a cancel: it shows the cell, and never closes on it
    blind = judged(killed, None)
    assert (blind.state, blind.ended) == ("killed", False)
    assert judged(killed, None, slurm=False).ended  # off SLURM, a signal's end is the end


def test_eta_from_the_finished_cells_durations():
    def cell(state: str, duration: float | None = None) -> cells.Cell:
        job = {"state": "FINISHED", "start": 0.0, "end": duration} if duration is not None else {}
        return cells.Cell(0, job=job, state=state)

    found = [cell("done", 60), cell("done", 180), cell("running"), cell("waiting"), cell("waiting")]
    # 3 left x 120 s mean over 1 running at once = 6 min
    assert eta(found).startswith("ETA ~6.0 min (3 cell(s) left, mean of 2 finished: 120 s, 1 running at once)")
    assert eta([cell("running")]).startswith("ETA unknown")
    assert eta([cell("done", 5), cell("killed")]) == "nothing left"


def test_a_jobs_state_tag_is_valid_json_with_its_end(store):
    """What prunebench-status reads is what the job wrote around its run, error line included."""
    client = MlflowClient(store)
    parent = client.create_run(experiment_id(store, "prunebench")).info.run_id
    try:
        with sweep.job_state(store, parent, 5, "sparsity=0.5", 300):
            raise ValueError("no such file")
    except ValueError:
        pass
    tag = json.loads(client.get_run(parent).data.tags[f"{cells.JOB_TAG}5"])
    assert tag["state"] == "FAILED" and tag["error"] == "ValueError: no such file" and tag["end"] >= tag["start"]
    assert tag["overrides"] == "sparsity=0.5"


def test_detach_with_a_launcher_that_cannot_return_is_refused_before_the_sweep_starts(fresh_store):
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", "model=tiny-llama", "pruner=none",
                           "task=local_mc", "detach=true"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 2, proc.stderr[-2000:]  # a usage error, as a single job's refusal
    assert "prunebench: invalid config: detach=true needs hydra/launcher=prunebench_slurm or slurm_gpu" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "BasicLauncher" in proc.stderr + proc.stdout
    assert not Path(fresh_store[len("sqlite:///"):]).exists()  # refused before the store was opened: no parent run
