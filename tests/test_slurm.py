"""Sweeps through SLURM for real: a one-node cluster (scripts/slurm_cluster.sh) runs a grid through
hydra/launcher=submitit_slurm while jobs are cancelled (scancel) and requeued (scontrol requeue)
under it; the same grid rerun through prunebench_slurm (waiting, as without detach) submits only the
cells left and leaves every cell FINISHED exactly once and nothing RUNNING. A recovery fine-tune
requeued mid-training resumes from its checkpoint and ends as an uninterrupted one."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient

from conftest import MC_FIXTURE, compose_cfg, pause_process
from prunebench.tracking.store import prepare_sqlite

ROOT = Path(__file__).resolve().parents[1]
GRID = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
        "trainer.enable_progress_bar=false", "pruner=random", "sparsity=0.2,0.4", "seed=0,1",
        "tracking.ensure_dense=false", "tracking.claim.heartbeat_s=1", "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=30"]
# pruner=random draws its masks from the seed, so seed=0,1 are 4 distinct cells (a pruner that does
# not use the seed, magnitude, keys both seeds as one run): one to cancel and one to requeue mid-job,
# two to finish, and spares for a hit that misses (a job that ends its run before the signal lands)
CELLS = 4
HANG_GUARD_S = 900  # only a broken cluster gets here


@pytest.fixture(scope="module")
def slurm_env():
    folder = tempfile.mkdtemp(prefix="prunebench-slurm-")  # under /tmp: the munge user must reach its socket
    start = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "start", folder],
                           capture_output=True, text=True, timeout=600)
    if start.returncode != 0:
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "stop", folder], timeout=60)
        pytest.skip(f"SLURM cannot start here: {start.stderr.strip()[-600:]}")
    env = {**os.environ, "SLURM_CONF": start.stdout.strip().split("=", 1)[1],
           # the jobs run this checkout's code, as the sweep does
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    yield env
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "stop", folder], timeout=60)


@pytest.fixture
def sweeps():
    """Starts sweeps; kills any still running when the test ends (a failed one leaves them waiting)."""
    started = []

    def start(env: dict, launcher: str = "submitit_slurm") -> subprocess.Popen:
        grid = [f"hydra/launcher={launcher}" if a.startswith("hydra/launcher=") else a for a in GRID]
        started.append(subprocess.Popen([sys.executable, "-m", "prunebench", "-m", *grid], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def job_runs(uri: str):
    prepare_sqlite(uri)  # as prunebench's processes do: a fresh file's first opens must take turns
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("prunebench")
    runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)
    return [r for r in runs if "prunebench.sweep" not in r.data.tags]


def interrupt(uri: str, env: dict, going: Callable[[], bool], release_requeued: bool = True) -> dict[str, list[str]]:
    """While the sweep runs (`going`): cancels one job and requeues another as soon as each holds its
    claim (inside the job, its run RUNNING), so each is hit mid-job. A look and the signal it leads to
    are apart in time, and a job may end its run between them: a hit counts once the job has ended
    its run KILLED; one whose run ended any other way missed, and another job takes its place. Returns
    the jobs hit that way, and under "requeued" every job requeued (SLURM holds each back, those that
    missed included)."""
    want = {"scancel": 1, "requeue": 1}
    landed = {"scancel": [], "requeue": []}
    pending: dict[str, tuple[str, str]] = {}  # run id -> (how it was hit, the job)
    tried, requeued = set(), []
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        runs = job_runs(uri)
        ended = {run.info.run_id: run.info.status for run in runs if run.info.status != "RUNNING"}
        for run_id in pending.keys() & ended.keys():
            how, job = pending.pop(run_id)
            if ended[run_id] == "KILLED":
                landed[how].append(job)
        short = {how: want[how] - len(landed[how]) - sum(h == how for h, _ in pending.values()) for how in want}
        running = going()
        if not pending and (not running or not any(short.values()) and not (queued(env) and release_requeued)):
            break
        # every eligible job of this look is hit in it: a job ends some 4 s after it starts, and a look
        # per hit (0.2 s apart, each a search) let the last ones end first
        for run in runs if running else ():
            worker = run.data.tags.get("prunebench.worker", "")
            job = worker.removeprefix("slurm:")  # the array task, as scancel names it (1_7)
            # a job that has not logged its metrics yet is some seconds from its end
            if run.info.status != "RUNNING" or run.data.metrics or job in tried or not worker.startswith("slurm:"):
                continue
            how = next((how for how in want if short[how]), None)
            if how is None:
                break
            # unchecked: SLURM may refuse to requeue a job that ended since the look, a hit that missed
            subprocess.run(["scancel", job] if how == "scancel" else ["scontrol", "requeue", job], env=env)
            tried.add(job)
            pending[run.info.run_id] = how, job
            short[how] -= 1
            if how == "requeue":
                requeued.append(job)
        if release_requeued:
            release(env, requeued)
        time.sleep(0.2)
    return {**landed, "requeued": requeued}


def release(env: dict, requeued: list[str]) -> None:
    """SLURM holds a requeued job back for two minutes; a test has no need to wait that out."""
    for job in requeued:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True, text=True)
        if state.stdout.split() == ["PENDING", "BeginTime"]:
            subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env=env, check=True)


def queued(env: dict) -> bool:
    return bool(subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.strip())


def wait_for_empty_queue(env: dict, requeued: list[str]) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while queued(env):
        assert time.monotonic() < deadline, "SLURM jobs never ended"
        release(env, requeued)
        time.sleep(1)


def test_grid_through_slurm_with_cancels_and_requeues_then_rerun_finishes_every_cell_once(slurm_env, store, tmp_path, sweeps):
    env = {**slurm_env, "MLFLOW_TRACKING_URI": store}
    first = sweeps(env)
    hit = interrupt(store, env, lambda: first.poll() is None)
    # without accounting (no slurmdbd) submitit cannot learn that a cancelled job ended and waits for
    # it forever: stopped as a user would stop it, its SIGTERM closes the sweep's parent run
    if first.poll() is None:
        first.terminate()
    out, _ = first.communicate(timeout=HANG_GUARD_S)
    assert len(hit["scancel"]) == 1 and len(hit["requeue"]) == 1, (hit, out[-4000:])
    assert first.returncode != 0, (hit, Counter(r.info.status for r in job_runs(store)), out[-6000:])  # a cancelled job fails it
    wait_for_empty_queue(env, hit["requeued"])
    runs = job_runs(store)
    # each job hit ended its run KILLED on SIGTERM; the requeued one then FINISHED as attempt 2
    assert Counter(r.info.status for r in runs) == {"FINISHED": CELLS - 1, "KILLED": 2}
    attempts = {r.data.tags["prunebench.worker"]: r.data.tags["prunebench.attempt"]
                for r in runs if r.info.status == "FINISHED"}
    assert [attempts.get(f"slurm:{job}") for job in hit["requeue"]] == ["2"]

    # prunebench's subclass of the plugin's launcher: only the cancelled cell becomes an array task (the
    # plugin's own would submit all four, three of them to start, import and find their run FINISHED)
    rerun = sweeps(env, "prunebench_slurm")
    out, _ = rerun.communicate(timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, out[-4000:]
    assert f"submitting 1 of {CELLS} cell(s)" in out, out[-4000:]
    runs = job_runs(store)
    finished = Counter(r.data.tags["prunebench.run_key"] for r in runs if r.info.status == "FINISHED")
    assert len(finished) == CELLS and set(finished.values()) == {1}
    assert not [r for r in runs if r.info.status == "RUNNING"]
    client = MlflowClient(store)
    parents = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id],
                                 filter_string="tags.`prunebench.sweep` = 'true'", order_by=["attributes.start_time ASC"])
    assert [p.info.status for p in parents] == ["FAILED", "FINISHED"]  # the rerun ran the cancelled cell
    assert parents[1].data.tags["prunebench.jobs_finished"] == "1"
    assert {r.data.tags.get("mlflow.parentRunId") for r in runs} == {p.info.run_id for p in parents}
    print("SLURM grid:", CELLS, "cells,", len(runs), "job runs:", dict(Counter(r.info.status for r in runs)),
          "cancelled", hit["scancel"], "requeued", hit["requeue"])

    from prunebench.report.cli import main as report

    assert report(["--experiment", "prunebench", "--out", str(tmp_path / "report")]) == 0
    rows = (tmp_path / "report" / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + CELLS


DETACHED_LAUNCH = ["tracking.claim.heartbeat_s=1", "hydra/launcher=prunebench_slurm", "detach=true",
                   "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=30"]
# 4 cells of a few seconds each (one to cancel, one to requeue, two that finish, spares as above):
# magnitude keys each sparsity once
DETACHED_CELLS = 4
DETACHED = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}", "limit=3",
            "trainer.enable_progress_bar=false", "pruner=magnitude",
            "sparsity=" + ",".join(f"{s / 20:g}" for s in range(1, DETACHED_CELLS + 1)),
            "tracking.ensure_dense=false", *DETACHED_LAUNCH]
ROW = re.compile(r"^\s*(\d+)\s+(done|running|failed|waiting|killed|submitting)\s+(\S+)\s+(.*)$")


def submit_detached(env: dict, overrides: list[str] = DETACHED) -> dict[str, str]:
    """The sweep command; it returns once SLURM has the array, naming what a user needs later."""
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *overrides], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"parent run (\w+)\nSLURM job ([\d, ()a-z:]+): (\d+) cell\(s\) submitted, (\d+) answered", proc.stdout)
    assert found and f"state: prunebench-status {found[1]} --uri " in proc.stdout, proc.stdout[-3000:]
    return {"parent": found[1], "job": found[2], "submitted": found[3], "answered": found[4]}


def status(capsys, *args: str) -> tuple[dict[int, tuple[str, str, str]], str]:
    """prunebench-status's rows by cell number: (state, SLURM's word, detail and overrides), and its text."""
    from prunebench.tracking.status import main

    capsys.readouterr()
    assert main(list(args)) == 0
    out = capsys.readouterr().out
    return {int(m[1]): (m[2], m[3], m[4]) for m in map(ROW.match, out.splitlines()) if m}, out


def test_detached_grid_closes_itself_after_cancels_and_a_requeue_and_a_rerun_completes_it(
        slurm_env, store, monkeypatch, capsys):
    env = {**slurm_env, "MLFLOW_TRACKING_URI": store}
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])  # for this process's squeue (prunebench-status)
    first = submit_detached(env)  # the submitting process has exited here
    assert (first["submitted"], first["answered"]) == (str(DETACHED_CELLS), "0") and first["job"].isdigit()
    client = MlflowClient(store)
    arrays = {json.loads(v)["slurm"]: int(k.rsplit(".", 1)[1])
              for k, v in client.get_run(first["parent"]).data.tags.items() if k.startswith("prunebench.array.")}
    assert len(arrays) == DETACHED_CELLS and all(task.startswith(first["job"] + "_") for task in arrays)
    hit = interrupt(store, env, lambda: queued(env), release_requeued=False)
    assert len(hit["scancel"]) == 1 and len(hit["requeue"]) == 1, hit
    (cancelled,), (requeued,) = [arrays[j] for j in hit["scancel"]], [arrays[j] for j in hit["requeue"]]

    # SLURM holds the requeued task back: meanwhile the status tells each kind of cell apart
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        rows, out = status(capsys, first["parent"], "--uri", store)
        if rows[cancelled][0] == "killed" and rows[requeued][0] == "waiting":
            break
        assert time.monotonic() < deadline, out
        time.sleep(1)
    assert sorted(rows) == list(range(DETACHED_CELLS)), out
    assert rows[cancelled][1] in ("CANCELLED", "GONE") and "stopped by a signal" in rows[cancelled][2], out
    assert rows[requeued][1] == "PENDING" and "requeued after a signal" in rows[requeued][2], out
    for state, word, detail in rows.values():
        assert state in ("done", "running", "waiting", "killed"), out
        if state == "running" and word == "RUNNING" and "heartbeat" in detail:
            assert re.search(r"heartbeat \d+ s ago, slurm:\d+_\d+", detail), out
        if state == "done":
            assert re.match(r"\d+ s", detail), out
    assert client.get_run(first["parent"]).info.status == "RUNNING"

    release(env, hit["requeued"])
    wait_for_empty_queue(env, hit["requeued"])
    parent = client.get_run(first["parent"])
    # counted as the blocking path counts: the cancelled run KILLED, the requeued task's first attempt retried
    assert parent.info.status == "FAILED", parent.data.tags
    assert {k: parent.data.tags[f"prunebench.jobs_{k}"] for k in ("finished", "failed", "killed", "running", "retried")} == \
        {"finished": str(DETACHED_CELLS - 1), "failed": "0", "killed": "1", "running": "0", "retried": "1"}
    # closed by the job that found itself the last cell to end, not by a status call
    assert parent.data.params["prunebench.closed_by"].startswith("slurm:" + first["job"] + "_")
    sweep_dir = Path(parent.data.tags["hydra.sweep_dir"])
    logs = [p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.*")]
    assert sum(text.count("sweep report: ") for text in logs) == 1  # written exactly once
    assert {"report/results.md", "report/results.csv"} <= {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert len((sweep_dir / "report" / "results.csv").read_text().strip().splitlines()) == 1 + DETACHED_CELLS - 1

    rows, out = status(capsys, "latest", "--uri", store)
    assert Counter(state for state, _, _ in rows.values()) == {"done": DETACHED_CELLS - 1, "killed": 1}, out
    assert f"closed FAILED ({DETACHED_CELLS - 1} finished, 0 failed, 1 killed, 0 running, 1 retried, 0 left)" in out, out
    assert "nothing left" in out

    second = submit_detached(env)  # the same command: only the cancelled cell is submitted again
    assert (second["submitted"], second["answered"]) == ("1", str(DETACHED_CELLS - 1))
    wait_for_empty_queue(env, [])
    parent = client.get_run(second["parent"])
    assert parent.info.status == "FINISHED" and parent.data.tags["prunebench.jobs_finished"] == "1"
    rows = (Path(parent.data.tags["hydra.sweep_dir"]) / "report" / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + DETACHED_CELLS  # the report covers the whole grid
    finished = Counter(r.data.tags["prunebench.run_key"] for r in job_runs(store) if r.info.status == "FINISHED")
    assert len(finished) == DETACHED_CELLS and set(finished.values()) == {1}


# one cell that fine-tunes for 24 tiny steps (2 micro-batches of 2 windows of 32 tokens a step), a
# checkpoint every 4: the job is held (SIGSTOP) at most one step past its first checkpoint until SLURM's
# requeue has signalled it, so the SIGTERM lands with 19 or more steps, each a write to the store, still
# to run, however fast the machine and however slow SLURM (a held job in a store call gets its handler's
# 50 ms to return from it, some steps at most)
RECOVERY_STEPS, CHECKPOINT_EVERY = 24, 4
RECOVERY = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}", "limit=3",
            "trainer.enable_progress_bar=false", "pruner=magnitude", "sparsity=0.5", "tracking.ensure_dense=false",
            "recovery=lora", "recovery.data=file", "recovery.seq_len=32", "recovery.batch_size=4",
            "recovery.micro_batch_size=2", "recovery.val_samples=4", "recovery.warmup_steps=0", "recovery.lr=1e-2",
            f"recovery.max_steps={RECOVERY_STEPS}", f"recovery.checkpoint_every={CHECKPOINT_EVERY}"]
RECOVERY_TEXT = "The quick brown fox jumps over the lazy dog. Question: What is the capital of France? Answer: Paris. "
# what the wall clock, the process and the interruption change; every other number must not move
UNEQUAL = ("recovery/seconds", "recovery/peak_host_gb", "recovery/peak_accelerator_gb", "recovery/resumed_at")


def hold_at_first_checkpoint(uri: str, cache: Path, env: dict) -> int:
    """Pauses the job once its first recovery checkpoint is on disk, and returns its pid. Each look is
    made holding the store's write lock: the job logs every optimizer step's loss to the store, so it
    cannot get past its next step while the test looks, then pauses it."""
    from prunebench.recovery.train import CHECKPOINT

    job_runs(uri)  # MLflow's first open of the file, outside the lock
    deadline = time.monotonic() + HANG_GUARD_S
    with closing(sqlite3.connect(uri[len("sqlite:///"):], timeout=HANG_GUARD_S, isolation_level=None)) as db:
        while True:
            db.execute("BEGIN IMMEDIATE")  # waits for a write of the job in progress to commit
            try:
                if any(cache.glob(f"recovery/*/{CHECKPOINT}")):
                    job = job_process(cache)
                    pause_process(job)
                    return job
            finally:
                db.execute("ROLLBACK")
            assert queued(env) and time.monotonic() < deadline, "the job ended without writing a recovery checkpoint"
            time.sleep(0.05)


def job_process(cache: Path) -> int:
    """The SLURM job's Python process: this interpreter, started with the test's own cache folder."""
    mark, python = f"PRUNEBENCH_CACHE={cache}".encode(), Path(sys.executable).resolve()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "exe").resolve() == python and \
                    mark in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:  # a process that ended meanwhile, or another user's
            continue
    raise AssertionError(f"no job process with {mark.decode()}")


def signalled(pid: int) -> bool:
    """Whether SLURM's requeue has reached the paused job: SIGTERM pending, the process resumed (slurmd
    sends SIGCONT before SIGTERM, so that a stopped job gets it), or gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except FileNotFoundError:
        return True
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return bool(pending >> (signal.SIGTERM - 1) & 1) or fields["State"].strip()[0] not in "Tt"


def test_a_recovery_requeued_mid_training_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
        slurm_env, store, tmp_path, monkeypatch, one_thread):
    from prunebench.job import run

    text = tmp_path / "recovery.txt"
    text.write_text(RECOVERY_TEXT * 200)
    cell = [*RECOVERY, f"recovery.path={text}"]
    cache = tmp_path / "cache"
    # one torch thread in the job, as in this process (one_thread), for the uninterrupted run below
    env = {**slurm_env, "MLFLOW_TRACKING_URI": store, "PRUNEBENCH_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    sweep = submit_detached(env, [*cell, *DETACHED_LAUNCH])
    client = MlflowClient(store)
    # SLURM's name for the cell (submitit submits a lone cell as a plain job, not an array task)
    (task,) = [json.loads(v)["slurm"] for k, v in client.get_run(sweep["parent"]).data.tags.items()
               if k.startswith("prunebench.array.")]
    job = hold_at_first_checkpoint(store, cache, env)
    try:
        subprocess.run(["scontrol", "requeue", task], env=env, check=True)
        deadline = time.monotonic() + HANG_GUARD_S
        while not signalled(job):
            assert time.monotonic() < deadline, "SLURM never signalled the requeued job"
            time.sleep(0.05)
    finally:
        if Path(f"/proc/{job}").exists():
            os.kill(job, signal.SIGCONT)
    wait_for_empty_queue(env, [task])

    runs = {r.info.status: r for r in job_runs(store)}
    assert sorted(runs) == ["FINISHED", "KILLED"], [(r.info.status, r.data.tags.get("prunebench.error")) for r in runs.values()]
    killed, finished = runs["KILLED"], runs["FINISHED"]
    assert killed.data.tags["prunebench.worker"] == finished.data.tags["prunebench.worker"] == f"slurm:{task}"
    assert finished.data.tags["prunebench.attempt"] == "2"
    resumed_at = finished.data.metrics["recovery/resumed_at"]
    assert 0 < resumed_at < RECOVERY_STEPS and resumed_at % CHECKPOINT_EVERY == 0, resumed_at
    assert finished.data.tags["prunebench.resumed_from"] == killed.info.run_id
    assert killed.data.tags["prunebench.resumed_by"] == finished.info.run_id
    assert not any((cache / "recovery").iterdir())  # the finished job's folder is gone
    # the cell's one result: the sweep FINISHED, its interrupted attempt counted as retried, not killed
    parent = client.get_run(sweep["parent"])
    assert parent.info.status == "FINISHED", parent.data.tags
    assert (parent.data.tags["prunebench.jobs_killed"], parent.data.tags["prunebench.jobs_retried"]) == ("0", "1")

    # the same cell uninterrupted, in this process, to its own experiment of the same store
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(cache))
    whole = run(compose_cfg([*cell, "tracking.experiment=uninterrupted"]))
    assert whole["recovery/resumed_at"] == 0
    (whole_run,) = client.search_runs([client.get_experiment_by_name("uninterrupted").experiment_id])

    def curve(run_id: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, "recovery/train_loss")]

    # the FINISHED run holds the whole loss curve: the steps before the checkpoint logged again from it
    assert [step for step, _ in curve(finished.info.run_id)] == list(range(1, RECOVERY_STEPS + 1))
    # fp32 on one thread in both processes: the resumed steps repeat the uninterrupted run's operations
    # on the same checkpointed tensors, batches and dropout draws, so every number agrees to the bit
    assert curve(finished.info.run_id) == curve(whole_run.info.run_id)
    compared = [k for k in whole if k.split("/")[0] in ("recovery", "local_mc", "sparsity", "params")
                and k not in UNEQUAL]
    assert {k: finished.data.metrics[k] for k in compared} == {k: whole[k] for k in compared}
    print(f"recovery requeued at step {resumed_at:g}: resumed and FINISHED as attempt 2, as uninterrupted")
