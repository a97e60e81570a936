"""Per-document results a report reads back from the `predictions/<task>.jsonl` artifacts jobs log:
correctness for the paired tests of the paper layout (a perplexity's windows for its verdicts), the
number of choices for chance levels."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException


@functools.cache
def read_predictions(run_id: str, task: str) -> list[dict]:
    """Cached: a report asks for a dense run's documents once per panel and per test."""
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"predictions/{task}.jsonl")
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Predictions:
    """Per-document correctness of a run's task, read once from its `predictions/<task>.jsonl`."""

    def __init__(self):
        self.cache: dict[tuple[str, str, str], tuple[str, dict] | None] = {}

    def correct(self, run_id: str, task: str, metric: str) -> tuple[str, dict] | None:
        """(the metric counted, {doc_id: 0/1}): the record's own value of the metric (acc, acc_norm,
        exact_match), else pred == gold, accuracy, for a classifier whose column is a corpus metric
        (MCC, F1: no document has one); None for a regression or a task without documents (perplexity)."""
        key = (run_id, task, metric)
        if key not in self.cache:
            records = read_predictions(run_id, task)
            if not records or "doc_id" not in records[0]:  # a perplexity's windows: no document is right or wrong
                self.cache[key] = None
            elif metric in records[0]:
                self.cache[key] = metric, {r["doc_id"]: float(r[metric]) for r in records}
            elif records and isinstance(records[0].get("gold"), int) and "pred" in records[0]:
                self.cache[key] = "acc", {r["doc_id"]: float(r["pred"] == r["gold"]) for r in records}
            else:
                self.cache[key] = None
        return self.cache[key]

    def values(self, run_id: str, task: str, metric: str) -> tuple[str, dict] | None:
        """What a verdict pairs: `correct`'s per-document values, else a perplexity's windows, (metric,
        {window: (NLL, tokens)}), which no document's correctness describes but whose pooled perplexity
        a paired bootstrap compares (report/verdicts.py `compare_perplexity`); None with neither."""
        if (found := self.correct(run_id, task, metric)) is not None:
            return found
        key = (run_id, task, f"{metric} windows")  # read once, as `correct` reads: a run is paired with several
        if key not in self.cache:
            records = read_predictions(run_id, task)
            windows = records and "window" in records[0]
            self.cache[key] = (metric, {r["window"]: (r["nll"], r["tokens"]) for r in records}) if windows else None
        return self.cache[key]


def chance_level(run_id: str, task: str) -> float | None:
    """The mean of 1 / choices over a run's documents (multiple choice); None for other tasks, and for
    a run that logged no predictions (a run made by hand, or by a version before the artifact)."""
    try:
        records = read_predictions(run_id, task)
    except MlflowException:
        return None
    if records and "loglikelihoods" in records[0]:
        return sum(1 / len(r["loglikelihoods"]) for r in records) / len(records)
    return None


def chance_levels(dense_runs) -> dict[tuple[str, str], float]:
    """{(setting, task): chance level} over (setting, task, run id) triples of dense runs: the first
    run of each pair (the documents, so their choices, are the setting's)."""
    levels = {}
    for setting, task, run_id in dense_runs:
        if (setting, task) not in levels:
            levels[setting, task] = chance_level(run_id, task)
    return {key: level for key, level in levels.items() if level is not None}


@functools.cache
def task_data(run_id: str, task: str) -> dict[str, str]:
    """{digest: file name} of the local data a run's task read (its MLflow dataset inputs of context
    `task:<task>`): the digest is the data's identity, whatever the file is called; {} for a task that
    read the hub only or a run logged without inputs."""
    inputs = mlflow.MlflowClient().get_run(run_id).inputs
    found = {}
    for entry in getattr(inputs, "dataset_inputs", None) or []:
        tags = {tag.key: tag.value for tag in entry.tags}
        if tags.get("mlflow.data.context") == f"task:{task}":
            found[entry.dataset.digest] = entry.dataset.name
    return found

