"""One row per model x pruner x sparsity (x task suite), read back from MLflow."""

from __future__ import annotations

import json

import mlflow
import pandas as pd

ID_COLUMNS = ["model", "pruner", "sparsity", "task"]
TRAILING = ["avg/score", "stability/avg", "sparsity/actual", "latency/median_s", "latency/speedup"]


def load_runs(experiment: str, sweep_run_id: str | None = None) -> pd.DataFrame:
    """FINISHED job runs (the newest per run key), optionally only the children of one sweep run."""
    filters = ["attributes.status = 'FINISHED'", "tags.`prunebench.run_key` != ''"]
    if sweep_run_id:
        filters.append(f"tags.`mlflow.parentRunId` = '{sweep_run_id}'")
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=" and ".join(filters),
                              order_by=["attributes.start_time DESC"])
    if runs.empty:
        return runs
    return runs.drop_duplicates("tags.prunebench.run_key")


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
    table = table.dropna(axis=1, how="all")
    return table.sort_values(["model", "task", "pruner", "sparsity"], key=dense_first).reset_index(drop=True)


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
