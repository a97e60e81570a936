"""The report's table holds exactly the metrics MLflow has."""

import mlflow

from conftest import TINY_MC, compose_cfg
from prunebench.job import run
from prunebench.report.cli import main as report_main
from prunebench.report.table import load_runs, results_table


def test_table_values_equal_mlflow_metrics(store, tmp_path, capsys):
    for overrides in (["pruner=none"], ["sparsity=0.5"], ["sparsity=0.7"]):
        run(compose_cfg(TINY_MC + overrides))
    mlflow.set_tracking_uri(store)
    runs = load_runs("prunebench")
    table = results_table(runs)
    assert list(table.pruner) == ["none", "magnitude", "magnitude"]
    assert list(table.sparsity) == [0.0, 0.5, 0.7]
    for _, row in table.iterrows():
        logged = runs[runs["tags.prunebench.sparsity"] == str(row.sparsity)].iloc[0]
        for col in ("local_mc/acc_norm", "avg/score", "stability/avg", "sparsity/actual"):
            assert row[col] == logged[f"metrics.{col}"], col
    assert report_main(["--experiment", "prunebench", "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("| model | pruner | sparsity | task | local_mc/acc_norm")
    assert (tmp_path / "rep" / "results.csv").read_text().count("\n") == 4


def test_missing_experiment_is_a_clear_error(store, capsys):
    assert report_main(["--experiment", "nope"]) == 2
    assert "no experiment named 'nope'" in capsys.readouterr().err
