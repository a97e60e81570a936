"""One row per model x pruner x sparsity (x task suite), read back from MLflow."""

from __future__ import annotations

import functools
import json

import mlflow
import pandas as pd

from prunebench.tracking.run_key import MODEL_RUNTIME_KEYS, RUNTIME_KEYS
from prunebench.tracking.sweep import cell_run_ids

ID_COLUMNS = ["model", "pruner", "sparsity", "task"]
# the setting that tells apart rows sharing the identity columns (`differences`)
DIFFERS = "differs"
# the short digest of the data a run read (job.py)
INPUTS_TAG = "tags.prunebench.inputs"
# run ids per search of the earlier runs a sweep reused
BATCH = 100
TRAILING = ["avg/score", "stability/avg", "sparsity/actual", "latency/median_s", "latency/speedup"]


def load_runs(experiment: str, sweep_run_id: str | None = None) -> pd.DataFrame:
    """FINISHED job runs (the newest per run key), optionally only one sweep's grid: the parent's
    children and the earlier runs its skipped jobs and dense baselines reused (tracking/sweep.py)."""
    filters = ["attributes.status = 'FINISHED'", "tags.`prunebench.run_key` != ''"]
    search = functools.partial(mlflow.search_runs, experiment_names=[experiment], order_by=["attributes.start_time DESC"])
    if not sweep_run_id:
        frames = [search(filter_string=" and ".join(filters))]
    else:
        frames = [search(filter_string=" and ".join([*filters, f"tags.`mlflow.parentRunId` = '{sweep_run_id}'"]))]
        reused = cell_run_ids(mlflow.MlflowClient().get_run(sweep_run_id))
        for start in range(0, len(reused), BATCH):  # a filter's IN list is kept short
            ids = ", ".join(f"'{run_id}'" for run_id in reused[start:start + BATCH])
            frames.append(search(filter_string=" and ".join([*filters, f"attributes.run_id IN ({ids})"])))
    frames = [frame for frame in frames if not frame.empty]
    if not frames:
        return pd.DataFrame()
    runs = pd.concat(frames, ignore_index=True)
    runs = runs.sort_values("start_time", ascending=False)
    return runs.drop_duplicates("tags.prunebench.run_key").reset_index(drop=True)


def results_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Columns: the identity, each task's primary metric (as the run's avg tag names it), then the
    average, stability, achieved sparsity and latency when logged."""
    rows, task_cols = [], []
    for _, run in runs.iterrows():
        row = {"model": run["tags.prunebench.model"], "pruner": run["tags.prunebench.pruner"],
               "sparsity": float(run["tags.prunebench.sparsity"]), "task": run["tags.prunebench.task"]}
        primary = json.loads(run.get("tags.prunebench.avg_metrics") or "{}")
        for task, metric in primary.items():
            col = f"{task}/{metric}"
            row[col] = run.get(f"metrics.{col}")
            if col not in task_cols:
                task_cols.append(col)
        for col in TRAILING:
            row[col] = run.get(f"metrics.{col}")
        rows.append(row)
    table = pd.DataFrame(rows, columns=ID_COLUMNS + task_cols + TRAILING)
    differs = differences(runs)
    if differs.any():  # rows of one model, pruner, sparsity and task that ran other settings or data
        table.insert(len(ID_COLUMNS), DIFFERS, differs.tolist())
    table = table.dropna(axis=1, how="all")
    return table.sort_values(["model", "task", "pruner", "sparsity"], key=dense_first).reset_index(drop=True)


def differences(runs: pd.DataFrame, shown: int = 40) -> pd.Series:
    """Per run, `key=value` of each setting (a logged param, or the digest of the data read) that
    differs between runs sharing a model, pruner, sparsity and task (limit, a data file, a template);
    empty strings when no two runs share them."""
    runtime = tuple(f"params.{key}" for key in RUNTIME_KEYS) + tuple(f"params.model.{key}" for key in MODEL_RUNTIME_KEYS)
    settings = [c for c in runs.columns if (c.startswith("params.") and not c.startswith(runtime)) or c == INPUTS_TAG]
    ids = [f"tags.prunebench.{c}" for c in ID_COLUMNS]
    varying = []
    for _, group in runs.groupby(ids, dropna=False):
        varying += [c for c in settings if c not in varying and group[c].astype(str).nunique() > 1]
    def label(column: str) -> str:
        return "data" if column == INPUTS_TAG else column.removeprefix("params.")
    def value(v) -> str:
        text = str(v)
        return text if len(text) <= shown else text[:shown - 3] + "..."
    return runs.apply(lambda run: ", ".join(f"{label(c)}={value(run[c])}" for c in varying), axis=1) \
        if varying else pd.Series([""] * len(runs), dtype=str)


def dense_first(col: pd.Series) -> pd.Series:
    return col.map(lambda v: "" if v == "none" else v) if col.name == "pruner" else col


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub-style table without the `tabulate` dependency pandas would need."""
    def fmt(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.4g}"
        return str(v)
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])
