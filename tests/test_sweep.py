"""Sweeps as a user runs them: the CLI in a subprocess against one SQLite store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
from PIL import Image

from conftest import MC_FIXTURE

BASE = ["model=tiny-llama", "task=local_mc", "trainer.enable_progress_bar=false"]


def sweep(*overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *BASE, *overrides],
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def all_runs(uri: str):
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])


def test_failing_job_fails_alone_then_a_rerun_only_runs_that_cell(store, tmp_path, capsys):
    paths = []
    for i in range(3):
        path = tmp_path / f"q{i}.jsonl"
        path.write_text(MC_FIXTURE.read_text())
        paths.append(path)
    paths[1].write_text("{this is not json\n")  # refused by validation: the cell still counts as failed, the next one runs
    grid = "task.tasks.local_mc.source.path=" + ",".join(str(p) for p in paths)
    proc = sweep(grid, "pruner=none", check=False)
    assert proc.returncode != 0  # the sweep reports the failure at the end ...
    runs = all_runs(store)
    children = runs[runs["tags.prunebench.sweep"].isna()]
    parent = runs[runs["tags.prunebench.sweep"] == "true"].iloc[0]
    assert sorted(children.status) == ["FAILED", "FINISHED", "FINISHED"], proc.stderr[-3000:]  # ... after all 3 ran
    assert set(children["tags.mlflow.parentRunId"]) == {parent.run_id}
    assert parent.status == "FAILED"  # any failed child fails the parent; counts say how many
    assert (parent["tags.prunebench.jobs_finished"], parent["tags.prunebench.jobs_failed"]) == ("2", "1")
    failed = children[children.status == "FAILED"].iloc[0]
    assert f"{paths[1]}, line 1, column 2" in failed["tags.prunebench.error"]
    # the sweep's report names the failed job and its error line, and the sweep printed it
    report = (Path(parent["tags.hydra.sweep_dir"]) / "report" / "results.md").read_text()
    assert "## Failed jobs (1)" in report and f"{paths[1]}, line 1, column 2" in report
    assert "## Failed jobs (1)" in proc.stdout and "| model | pruner | sparsity | task |" in proc.stdout
    # prunebench-status reads the same sweep from the store: each cell's state, the failed one's error line
    from prunebench.tracking.status import main as status

    capsys.readouterr()
    assert status(["latest"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:4].strip().isdigit()]
    assert [(row[0], row[1]) for row in rows] == [("0", "done"), ("1", "failed"), ("2", "done")], out
    failed_line = next(line for line in out.splitlines() if line.split()[:2] == ["1", "failed"])
    assert f"{paths[1]}, line 1, column 2" in failed_line, out
    assert "3 cell(s): 2 done, 1 failed; nothing left" in out and "closed FAILED (2 finished, 1 failed" in out
    paths[1].write_text(MC_FIXTURE.read_text())
    sweep(grid, "pruner=none")
    runs = all_runs(store)
    children = runs[runs["tags.prunebench.sweep"].isna()]
    assert len(children) == 4 and sorted(children.status) == ["FAILED"] + ["FINISHED"] * 3
    newest_parent = runs[runs["tags.prunebench.sweep"] == "true"].iloc[-1]
    assert newest_parent.status == "FINISHED"
    assert newest_parent["tags.prunebench.jobs_finished"] == "1"  # the other two were skipped


def test_joblib_parallel_sweep_loses_no_run(store):
    """Two joblib workers writing one SQLite store, two jobs each: every run is there."""
    sweep("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "pruner=magnitude",
          "sparsity=0.1,0.2,0.3,0.4", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
          "tracking.ensure_dense=false")
    runs = all_runs(store)
    children = runs[runs["tags.prunebench.sweep"].isna()]
    assert len(children) == 4 and set(children.status) == {"FINISHED"}
    assert sorted(children["tags.prunebench.sparsity"]) == ["0.1", "0.2", "0.3", "0.4"]


def test_sweep_report_plots_and_stability_with_ensured_dense(store, tmp_path):
    sweep("pruner=magnitude", "sparsity=0.3,0.6",
          f"task.tasks.local_mc.source.path={MC_FIXTURE}")
    runs = all_runs(store)
    children = runs[runs["tags.prunebench.sweep"].isna()]
    # the dense baseline was evaluated once, first, inside the same sweep
    assert list(children["tags.prunebench.pruner"]) == ["none", "magnitude", "magnitude"]
    assert children["metrics.stability/avg"].notna().all()
    parent = runs[runs["tags.prunebench.sweep"] == "true"].iloc[0]
    report = Path(parent["tags.hydra.sweep_dir"]) / "report"
    arts = {a.path for a in mlflow.MlflowClient(store).list_artifacts(parent.run_id, "report")}
    assert {"report/results.md", "report/results.csv", "report/metric_vs_sparsity.png",
            "report/stability_vs_sparsity.png"} <= arts
    for name in ("metric_vs_sparsity.png", "stability_vs_sparsity.png"):
        pixels = np.asarray(Image.open(report / name).convert("L"))
        assert pixels.shape[0] > 200 and pixels.std() > 5, name  # a drawn figure, not a blank canvas


def test_report_figures_have_one_panel_per_task_and_one_line_per_pruner():
    import pandas as pd

    from prunebench.report import plots

    table = pd.DataFrame({"model": ["m"] * 5, "pruner": ["none", "a", "a", "b", "b"],
                          "sparsity": [0.0, 0.3, 0.5, 0.3, 0.5], "task": ["s"] * 5,
                          "t1/acc": [0.8, 0.7, 0.5, 0.75, 0.6], "t2/acc_norm": [0.6, 0.5, 0.4, 0.55, 0.5],
                          "avg/score": [0.7, 0.6, 0.45, 0.65, 0.55], "latency/median_s": [1.0, 0.8, 0.6, 0.9, 0.7],
                          "stability/avg": [100, 85, 64, 92, 78]})
    fig = plots.metric_vs_sparsity(table, ["t1/acc", "t2/acc_norm"])
    assert len(fig.axes) == 2
    assert [len(ax.containers) for ax in fig.axes] == [2, 2]  # an error-bar line per pruner
    assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == [0.0, 0.3, 0.5]  # each starts at the dense point
    # (speedup, quality): (1.1, 0.5) is beaten by (1.2, 0.6) on both, (1.5, 0.4) by (1.6, 0.45)
    assert plots.pareto_front([(1.0, 0.7), (1.2, 0.6), (1.1, 0.5), (1.6, 0.45), (1.5, 0.4), (1.3, 0.65)]) == [
        (1.0, 0.7), (1.3, 0.65), (1.6, 0.45)]


def test_sweep_report_averages_a_suite_evaluated_task_by_task(store, glue_dir):
    """The suites are composed inside the running Hydra app, at the sweep's end."""
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", "model=tiny-llama", "task=sst2_mc,rte_mc",
                           f"data_dir={glue_dir}", "pruner=none", "limit=8", "trainer.enable_progress_bar=false"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = all_runs(store)
    parent = runs[runs["tags.prunebench.sweep"] == "true"].iloc[0]
    report = Path(parent["tags.hydra.sweep_dir"]) / "report"
    assert "## glue_mc: averaged across single-task runs" in (report / "results.md").read_text()
    arts = {a.path for a in mlflow.MlflowClient(store).list_artifacts(parent.run_id, "report")}
    assert "report/suite_glue_mc.csv" in arts
    children = runs[runs["tags.prunebench.sweep"].isna()]
    summary = (report / "suite_glue_mc.csv").read_text().splitlines()
    assert summary[0].startswith("setting,model,pruner,sparsity,sst2_mc/acc,rte_mc/acc,avg/score")
    assert len(summary) == 2 and ",2/8,True," in summary[1]
    assert float(summary[1].split(",")[6]) == pytest.approx(children["metrics.avg/score"].mean())
