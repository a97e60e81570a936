"""Sweeps through hydra-submitit-launcher: every job in its own process, as on a cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow

from conftest import MC_FIXTURE

SRC = str(Path(__file__).resolve().parents[1] / "src")
BASE = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
        "trainer.enable_progress_bar=false", "tracking.claim.heartbeat_s=0.2"]


def sweep(*overrides: str) -> subprocess.CompletedProcess:
    # the job processes import this checkout, as the sweep does
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *BASE, *overrides], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def split(uri: str):
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])
    return runs[runs["tags.prunebench.sweep"] == "true"], runs[runs["tags.prunebench.sweep"].isna()]


def test_submitit_local_sweep_links_jobs_in_other_processes_and_reports_at_the_end(store):
    sweep("hydra/launcher=submitit_local", "pruner=magnitude", "sparsity=0.3,0.6")
    parents, children = split(store)
    assert len(parents) == 1
    parent = parents.iloc[0]
    # both jobs needed the dense baseline at once: one ran it, the other waited for its claim
    assert sorted(children["tags.prunebench.pruner"]) == ["magnitude", "magnitude", "none"]
    assert set(children.status) == {"FINISHED"} and parent.status == "FINISHED"
    assert set(children["tags.mlflow.parentRunId"]) == {parent.run_id}
    workers = set(children["tags.prunebench.worker"])
    assert len(workers) == 2 and f":{os.getpid()}" not in " ".join(workers)  # two job processes, not ours
    assert children["metrics.stability/avg"].notna().all()
    arts = {a.path for a in mlflow.MlflowClient(store).list_artifacts(parent.run_id, "report")}
    assert {"report/results.md", "report/results.csv"} <= arts
    assert (Path(parent["tags.hydra.sweep_dir"]) / "report" / "results.md").exists()
