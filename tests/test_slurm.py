"""Sweeps through SLURM for real: a one-node cluster (scripts/slurm_cluster.sh) runs a grid through
hydra/launcher=submitit_slurm while jobs are cancelled (scancel) and requeued (scontrol requeue)
under it; the same sweep rerun then leaves every cell FINISHED exactly once and nothing RUNNING."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import MC_FIXTURE
from prunebench.tracking.store import prepare_sqlite

ROOT = Path(__file__).resolve().parents[1]
SPARSITIES = ",".join(f"{s / 20:g}" for s in range(1, 11))
GRID = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
        "trainer.enable_progress_bar=false", "pruner=random", f"sparsity={SPARSITIES}", "seed=0,1",
        "tracking.ensure_dense=false", "tracking.claim.heartbeat_s=1", "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=30"]
# pruner=random draws its masks from the seed, so seed=0,1 are 20 distinct cells (a pruner that does
# not use the seed, magnitude, keys both seeds as one run)
CELLS = 20
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

    def start(env: dict) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-m", "prunebench", "-m", *GRID], env=env, text=True,
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


def interrupt(uri: str, env: dict, proc: subprocess.Popen) -> dict[str, list[str]]:
    """While the sweep runs: cancels two jobs and requeues two others as soon as each holds its claim
    (inside the job, its run RUNNING), so each is hit mid-job."""
    done = {"scancel": [], "requeue": []}
    deadline = time.monotonic() + HANG_GUARD_S
    while proc.poll() is None and time.monotonic() < deadline:
        hit = {j for jobs in done.values() for j in jobs}
        if len(hit) == 4 and not queued(env):
            break
        for run in job_runs(uri) if len(hit) < 4 else ():
            worker = run.data.tags.get("prunebench.worker", "")
            job = worker.removeprefix("slurm:")  # the array task, as scancel names it (1_7)
            # a job that has not logged its metrics yet is some seconds from its end
            if run.info.status != "RUNNING" or run.data.metrics or job in hit or not worker.startswith("slurm:"):
                continue
            if len(done["scancel"]) < 2:
                subprocess.run(["scancel", job], env=env, check=True)
                done["scancel"].append(job)
            else:
                subprocess.run(["scontrol", "requeue", job], env=env, check=True)
                done["requeue"].append(job)
            break
        release(env, done["requeue"])
        time.sleep(0.2)
    return done


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
    hit = interrupt(store, env, first)
    # without accounting (no slurmdbd) submitit cannot learn that a cancelled job ended and waits for
    # it forever: stopped as a user would stop it, its SIGTERM closes the sweep's parent run
    if first.poll() is None:
        first.terminate()
    out, _ = first.communicate(timeout=HANG_GUARD_S)
    assert len(hit["scancel"]) == 2 and len(hit["requeue"]) == 2, out[-4000:]
    assert first.returncode != 0, (hit, Counter(r.info.status for r in job_runs(store)), out[-6000:])  # cancelled jobs fail it
    wait_for_empty_queue(env, hit["requeue"])
    runs = job_runs(store)
    # each job hit ended its run KILLED on SIGTERM; each requeued one then FINISHED as attempt 2
    assert Counter(r.info.status for r in runs) == {"FINISHED": CELLS - 2, "KILLED": 4}
    attempts = {r.data.tags["prunebench.worker"]: r.data.tags["prunebench.attempt"]
                for r in runs if r.info.status == "FINISHED"}
    assert [attempts.get(f"slurm:{job}") for job in hit["requeue"]] == ["2", "2"]

    rerun = sweeps(env)
    out, _ = rerun.communicate(timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, out[-4000:]
    runs = job_runs(store)
    finished = Counter(r.data.tags["prunebench.run_key"] for r in runs if r.info.status == "FINISHED")
    assert len(finished) == CELLS and set(finished.values()) == {1}
    assert not [r for r in runs if r.info.status == "RUNNING"]
    client = MlflowClient(store)
    parents = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id],
                                 filter_string="tags.`prunebench.sweep` = 'true'", order_by=["attributes.start_time ASC"])
    assert [p.info.status for p in parents] == ["FAILED", "FINISHED"]  # the rerun ran the 2 cancelled cells
    assert parents[1].data.tags["prunebench.jobs_finished"] == "2"
    assert {r.data.tags.get("mlflow.parentRunId") for r in runs} == {p.info.run_id for p in parents}
    print("SLURM grid:", CELLS, "cells,", len(runs), "job runs:", dict(Counter(r.info.status for r in runs)),
          "cancelled", hit["scancel"], "requeued", hit["requeue"])

    from prunebench.report.cli import main as report

    assert report(["--experiment", "prunebench", "--out", str(tmp_path / "report")]) == 0
    rows = (tmp_path / "report" / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + CELLS
