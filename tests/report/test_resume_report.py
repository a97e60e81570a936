"""Reports survive a resume: a sweep's report covers its whole grid (cells run now or earlier, the
dense baseline too), a sweep whose every job is skipped still writes one, rows that ran other
settings or data say what differs, and two sweeps started together keep apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd

from conftest import MC_FIXTURE, compose_cfg
from prunebench.inputs import digest
from prunebench.job import run
from prunebench.report.build import write_report
from prunebench.report.cli import main as report_main
from prunebench.report.table import load_runs, results_table

BASE = ["-m", "model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
        "trainer.enable_progress_bar=false", "pruner=magnitude", "limit=2"]


def sweep(*overrides: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "prunebench", *BASE, *overrides], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def parents(uri: str) -> pd.DataFrame:
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["prunebench"], filter_string="tags.`prunebench.sweep` = 'true'",
                              order_by=["attributes.start_time ASC"])


def report_rows(parent) -> list[tuple[str, float]]:
    table = pd.read_csv(Path(parent["tags.hydra.sweep_dir"]) / "report" / "results.csv")
    return sorted(zip(table.pruner, table.sparsity))


def test_a_resumed_sweep_reports_its_whole_grid_and_an_all_skipped_one_still_reports(store, tmp_path, capsys):
    # the cell done earlier, in this process (with the dense baseline it ensures): the sweeps are tested here
    run(compose_cfg([arg for arg in BASE if arg != "-m"] + ["sparsity=0.3"]))
    second = sweep("sparsity=0.3,0.5")  # 0.3 and the dense baseline were done before
    assert "sweep report:" in second.stdout + second.stderr
    sweep("sparsity=0.3,0.5")  # every job skipped
    resumed, skipped = (row for _, row in parents(store).iterrows())
    grid = [("magnitude", 0.3), ("magnitude", 0.5), ("none", 0.0)]
    assert report_rows(resumed) == grid
    assert skipped["tags.prunebench.jobs_finished"] == "0" and report_rows(skipped) == grid
    capsys.readouterr()
    assert report_main(["--sweep", "latest", "--out", str(tmp_path / "latest")]) == 0
    assert sorted(zip(*[pd.read_csv(tmp_path / "latest" / "results.csv")[c] for c in ("pruner", "sparsity")])) == grid


def test_two_sweeps_started_together_on_a_fresh_store_keep_their_own_parent_folder_and_report(fresh_store):
    procs = [subprocess.Popen([sys.executable, "-m", "prunebench", *BASE, "pruner=none", f"seed={seed}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        assert "CommandError" not in err and "could not" not in err, err[-4000:]
    found = parents(fresh_store)
    assert len(found) == 2 and set(found.status) == {"FINISHED"}
    folders = set(found["tags.hydra.sweep_dir"])
    assert len(folders) == 2 and all((Path(f) / "report" / "results.md").is_file() for f in folders)


def test_runs_of_other_limits_or_data_get_their_own_tables_and_differs_says_what_in_words(store, tmp_path):
    data = tmp_path / "more.jsonl"
    data.write_text(MC_FIXTURE.read_text() + json.dumps({"question": "1+1?", "choices": ["2", "3"], "label": 0}) + "\n")
    base = ["model=tiny-llama", "task=local_mc", "pruner=none", "trainer.enable_progress_bar=false"]
    template = "task.tasks.local_mc.doc_to_text='Q: {{question}} A:'"
    for overrides in ([f"task.tasks.local_mc.source.path={MC_FIXTURE}", "limit=1"],
                      [f"task.tasks.local_mc.source.path={MC_FIXTURE}", "limit=2"],
                      [f"task.tasks.local_mc.source.path={data}", "limit=2"],
                      [f"task.tasks.local_mc.source.path={data}", "limit=2", template]):
        run(compose_cfg(base + overrides))
    mlflow.set_tracking_uri(store)
    table = results_table(load_runs("prunebench"))
    # never in one table: each limit and each data file is a setting of its own, headed by it in words
    headings = sorted(set(table.setting))
    assert [h.split(" · ")[2:4] for h in headings] == [
        ["limit=1", f"data=mc_questions.jsonl@{digest(MC_FIXTURE)[:4]}"],
        ["limit=2", f"data=mc_questions.jsonl@{digest(MC_FIXTURE)[:4]}"],
        ["limit=2", f"data=more.jsonl@{digest(data)[:4]}"]]
    text = (write_report("prunebench", None, tmp_path / "report") / "results.md").read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == headings
    # within a setting, what still differs is named by the override that sets it, not by a digest
    differs = sorted(table[table.setting == headings[2]].differs)
    assert differs == ["task.tasks.local_mc.doc_to_text=Q: {{question}} A:",
                       "task.tasks.local_mc.doc_to_text=Question: {{question}}\\nAnswer:"]
    assert set(table[table.setting != headings[2]].differs) == {""}


def test_a_report_without_stability_says_why(store, tmp_path):
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    tags = {"prunebench.run_key": "k", "prunebench.model": "m", "prunebench.pruner": "none", "prunebench.task": "t",
            "prunebench.sparsity": "0.0", "prunebench.avg_metrics": json.dumps({"t": "acc"}),
            "prunebench.stability_excluded": json.dumps({"t": "dense value 0 < 0.05: at or near chance"})}
    with mlflow.start_run(tags=tags):
        mlflow.log_metrics({"t/acc": 0.0, "avg/score": 0.0})
    out = write_report("prunebench", None, tmp_path / "report")
    text = (out / "results.md").read_text()
    assert "No stability column or plot" in text and "t: dense value 0 < 0.05" in text
    assert not (out / "stability_vs_sparsity.png").exists()
