"""The report's table holds exactly the metrics MLflow has."""

import json
import shutil

import mlflow
import pandas as pd
import pytest

from conftest import TINY_MC, compose_cfg
from prunebench.paths import CONF_DIR
from prunebench.job import run
from prunebench.report import plots
from prunebench.report.build import write_report
from prunebench.report.cli import main as report_main
from prunebench.report.suites import suite_members, suite_tables
from prunebench.report.table import load_runs, results_table, task_columns


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
    lines = printed.splitlines()
    # one setting: one table, headed by what it holds
    assert lines[0].startswith("## tiny-llama · task=local_mc · limit=null · data=mc_questions.jsonl@")
    assert lines[0].endswith(" · dtype=float32 · numerics=fast · protocol=lm_eval · chat=none")
    assert lines[2] == "documents: local_mc 5"  # how many documents its numbers rest on
    assert lines[4].startswith("| model | pruner | sparsity | task | local_mc/acc_norm")
    assert (tmp_path / "rep" / "results.csv").read_text().count("\n") == 4
    # two ratios: a line against the ratio from the dense point, not methods side by side
    (ax,) = plots.metric_vs_sparsity(table, task_columns(table)).axes
    (line,) = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert list(line.get_xdata()) == [0.0, 0.5, 0.7] and ax.get_xlabel() == "sparsity"
    assert ax.get_title() == "tiny-llama · local_mc\nlocal_mc/acc_norm"


def test_missing_experiment_is_a_clear_error(store, capsys):
    assert report_main(["--experiment", "nope"]) == 2
    assert "no experiment named 'nope'" in capsys.readouterr().err


GLUE = ["sst2", "cola", "mrpc", "qqp", "stsb", "qnli", "mnli", "rte"]


def test_suites_are_read_from_the_task_options():
    suites = suite_members()
    assert suites["glue"] == GLUE
    assert suites["glue_mc"] == [f"{t}_mc" for t in ["sst2", "cola", "mrpc", "qqp", "qnli", "mnli", "mnli_mismatch",
                                                     "rte"]]
    assert "sst2" not in suites and "cola_mc" not in suites  # single-task options are no suites


def test_suites_are_composed_again_when_a_task_option_changes(tmp_path):
    """Composed once per process while the config files stay as they are; a suite written since is read."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    assert "pair" not in suite_members(str(conf))
    (conf / "task" / "pair.yaml").write_text("defaults:\n  - sst2\n  - cola\n  - _self_\nname: pair\n")
    assert suite_members(str(conf))["pair"] == ["sst2", "cola"]


def test_glue_average_across_per_task_checkpoints(glue_dir, store, tmp_path, capsys):
    """HIES's layout: one fine-tuned checkpoint per GLUE task, one job per (checkpoint, sparsity)."""
    labels = {"sst2": "[negative,positive]", "cola": "[unacceptable,acceptable]", "stsb": "[]"}
    for task in ("sst2", "cola", "stsb"):
        run(compose_cfg(["model=tiny-bert-cls", f"model.name=bert-{task}", f"model.labels={labels[task]}",
                         f"task={task}", f"data_dir={glue_dir}", "pruner=heads_l2", "sparsity=0.5",
                         "trainer.enable_progress_bar=false"]))  # and its dense baseline, first
    mlflow.set_tracking_uri(store)
    runs = load_runs("prunebench")
    assert len(runs) == 6
    assert report_main(["--experiment", "prunebench", "--out", str(tmp_path / "rep")]) == 0
    assert "## glue: averaged across single-task runs" in capsys.readouterr().out
    summary = pd.read_csv(tmp_path / "rep" / "suite_glue.csv", keep_default_na=False)
    # stability/avg is left out when no row has one (a random model's dense CoLA MCC is 0: no ratio)
    assert [c for c in summary.columns if c != "stability/avg"] == [
        "setting", "model", "pruner", "sparsity", "sst2/acc", "cola/mcc", "stsb/pearson", "avg/score", "tasks", "partial",
        "missing", "runs"]
    assert list(zip(summary.model, summary.pruner, summary.sparsity)) == [("(one per task)", "none", 0.0),
                                                                          ("(one per task)", "heads_l2", 0.5)]
    for _, row in summary.iterrows():
        logged = runs[runs["tags.prunebench.pruner"] == row.pruner]
        primary = {t: logged[logged["tags.prunebench.task"] == t].iloc[0] for t in ("sst2", "cola", "stsb")}
        values = [primary["sst2"]["metrics.sst2/acc"], primary["cola"]["metrics.cola/mcc"],
                  primary["stsb"]["metrics.stsb/pearson"]]
        assert [row["sst2/acc"], row["cola/mcc"], row["stsb/pearson"]] == pytest.approx(values, abs=1e-12)
        assert row["avg/score"] == pytest.approx(sum(values) / 3, abs=1e-12)
        # a task without a stability (dense value near zero: no metric logged) stays out of the average
        stabilities = [v for t in ("sst2", "cola", "stsb") if pd.notna(v := primary[t].get(f"metrics.stability/{t}"))]
        want = sum(stabilities) / len(stabilities) if stabilities else float("nan")
        assert row.get("stability/avg", float("nan")) == pytest.approx(want, abs=1e-9, nan_ok=True)
        assert (row.tasks, row.partial, row.missing, row.runs) == ("3/8", True, "mrpc qqp qnli mnli rte", 3)
    assert not (tmp_path / "rep" / "suite_glue_vs_sparsity.png").exists()  # partial averages are not plotted


def log_run(model: str, task: str, metric: str, value: float, pruner: str = "magnitude", sparsity: float = 0.5,
            stability: float | None = None, protocol: str | None = None, limit: int | None = None):
    """A FINISHED run with the tags a job logs, through the MLflow API."""
    tags = {"prunebench.run_key": f"{model}|{task}|{pruner}|{sparsity}|{protocol}|{limit}", "prunebench.model": model,
            "prunebench.pruner": pruner, "prunebench.task": task, "prunebench.sparsity": str(sparsity),
            "prunebench.avg_metrics": json.dumps({task: metric}),
            **({"prunebench.protocol": protocol} if protocol else {})}
    with mlflow.start_run(tags=tags):
        if limit is not None:
            mlflow.log_param("limit", limit)
        mlflow.log_metrics({f"{task}/{metric}": value, "avg/score": value,
                            **({f"stability/{task}": stability} if stability is not None else {})})


def test_suite_rows_per_model_pooled_checkpoints_and_partial_averages(store, tmp_path, capsys):
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    for task, value in zip(GLUE, [0.9, 0.5, 0.8, 0.85, 0.7, 0.88, 0.8, 0.6]):  # a checkpoint per task
        log_run(f"bert-{task}", task, {"cola": "mcc", "mrpc": "f1", "stsb": "pearson"}.get(task, "acc"), value)
    log_run("bert-cola-2", "cola", "mcc", 0.3)  # a second CoLA checkpoint: averaged, counted in `runs`
    log_run("bert-sst2", "sst2", "acc", 0.7, sparsity=0.7)  # alone at this sparsity
    log_run("llm", "sst2_mc", "acc", 0.6, stability=80.0)  # a model running several tasks keeps its own rows
    log_run("llm", "cola_mc", "mcc", 0.1, stability=50.0)
    log_run("llm-b", "rte_mc", "acc", 0.55)
    for protocol, (piqa, hellaswag) in {"lm_eval": (0.7, 0.5), "opencompass": (0.8, 0.6)}.items():
        log_run("llm", "piqa", "acc_norm", piqa, protocol=protocol)  # never averaged across protocols
        log_run("llm", "hellaswag", "acc_norm", hellaswag, protocol=protocol)
    with mlflow.start_run(tags={"prunebench.run_key": "llm|glue_mc", "prunebench.model": "llm",
                                "prunebench.pruner": "none", "prunebench.task": "glue_mc",
                                "prunebench.sparsity": "0.0",
                                "prunebench.avg_metrics": json.dumps({"sst2_mc": "acc", "rte_mc": "acc"})}):
        mlflow.log_metrics({"sst2_mc/acc": 0.9, "rte_mc/acc": 0.9})  # a suite run has its own avg/score
    runs, members = load_runs("prunebench"), suite_members()
    tables = suite_tables(runs, members=members)
    assert sorted(tables) == ["commonsense", "dynmoe", "dynmoe_opencompass", "glue", "glue_mc"]  # not hies_llm
    dynmoe = tables["dynmoe"]
    assert dynmoe[["protocol", "piqa/acc_norm", "hellaswag/acc_norm", "tasks"]].values.tolist() == [
        ["lm_eval", 0.7, 0.5, "2/4"], ["opencompass", 0.8, 0.6, "2/4"]]
    glue = tables["glue"].set_index("sparsity")
    assert glue.loc[0.5, "cola/mcc"] == pytest.approx(0.4) and glue.loc[0.5, "runs"] == 9
    assert glue.loc[0.5, "avg/score"] == pytest.approx((0.9 + 0.4 + 0.8 + 0.85 + 0.7 + 0.88 + 0.8 + 0.6) / 8)
    assert (glue.loc[0.5, "tasks"], glue.loc[0.5, "partial"], glue.loc[0.5, "missing"]) == ("8/8", False, "")
    assert (glue.loc[0.7, "avg/score"], glue.loc[0.7, "tasks"], glue.loc[0.7, "partial"]) == (0.7, "1/8", True)
    assert "stability/avg" not in glue and "protocol" not in glue  # none logged; all lm-eval's
    mc = tables["glue_mc"]
    assert list(mc.model) == ["(one per task)", "llm"]
    assert mc.iloc[1]["stability/avg"] == 65.0 and pd.isna(mc.iloc[0]["stability/avg"])
    assert mc.iloc[1][["sst2_mc/acc", "cola_mc/mcc", "avg/score", "tasks"]].tolist() == [0.6, 0.1, 0.35, "2/8"]
    assert mc.iloc[0]["rte_mc/acc"] == 0.55 and mc.iloc[0]["tasks"] == "1/8"
    with pytest.raises(ValueError, match=r"unknown suite\(s\) \['nope'\]"):
        suite_tables(runs, ["nope"], members)
    with pytest.raises(LookupError, match="suite bigbench_mc: no FINISHED single-task run"):
        suite_tables(runs, ["bigbench_mc"], members)
    assert list(suite_tables(runs, ["glue"], members)) == ["glue"]
    assert report_main(["--experiment", "prunebench", "--suite", "nope", "--out", str(tmp_path / "rep")]) == 2
    assert "unknown suite(s) ['nope']" in capsys.readouterr().err


def test_suite_rows_never_pool_runs_of_other_limits_or_dtypes(store, tmp_path):
    """Checkpoints per task pool into one suite row only when they rest on the same documents and
    numbers: a CoLA run over 10 documents is not averaged with SST-2 runs over all of theirs."""
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    log_run("bert-sst2", "sst2", "acc", 0.9)
    log_run("bert-cola", "cola", "mcc", 0.5)
    log_run("bert-cola-10", "cola", "mcc", 0.1, limit=10)
    log_run("bert-sst2-10", "sst2", "acc", 0.7, limit=10)
    glue = suite_tables(load_runs("prunebench"), ["glue"], suite_members())["glue"]
    assert glue.setting.tolist() == ["(one per task) · limit=10 · numerics=fast · protocol=lm_eval · chat=none",
                                     "(one per task) · limit=null · numerics=fast · protocol=lm_eval · chat=none"]
    assert glue["avg/score"].tolist() == [pytest.approx(0.4), pytest.approx(0.7)]
    write_report("prunebench", None, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "## glue: averaged across single-task runs · (one per task) · limit=10" in text
    assert "## glue: averaged across single-task runs · (one per task) · limit=null" in text
