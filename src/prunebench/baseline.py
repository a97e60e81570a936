"""A pruned run against its dense baseline: the dense run of the same key found in the store, and
the numbers the comparison gives (stability per task and on average, paired bootstrap intervals
over the documents both evaluated)."""

from __future__ import annotations

import json
import logging

import mlflow

from prunebench.tracking import store
from prunebench.tracking.stability import paired_bootstrap, stability

log = logging.getLogger(__name__)


def per_document(records: list[dict], task) -> tuple[str, dict]:
    """(how a resample of documents becomes the task's number, a name in stability.STATISTICS;
    {doc_id: the document's value of the primary metric}). A task whose number is not a mean of
    per-document values says how its documents combine (`document_values`: perplexity pools its
    windows' NLL and tokens); a corpus-level metric no document has a value of (MCC) gives {}."""
    if hasattr(task, "document_values"):
        return task.document_values(records)
    metric = task.primary
    if not records or not isinstance(records[0].get(metric), (int, float)):
        return "mean", {}
    return "mean", {r.get("doc_id", i): float(r[metric]) for i, r in enumerate(records)}


def read_records(run_id: str, task: str) -> list[dict]:
    """A run's `predictions/<task>.jsonl`, read as the reports read it; [] when it has none (a run
    older than the artifact)."""
    from mlflow.exceptions import MlflowException

    from prunebench.report.predictions import read_predictions

    try:
        return read_predictions(run_id, task)
    except (MlflowException, OSError):
        return []


def against_dense(primary: dict[str, float], scored: dict, documents: dict[str, tuple[str, dict]],
                  dense_run) -> dict[str, float]:
    """Stability and its paired intervals for the tasks `primary` scored, against `dense_run` (None:
    the run is the dense one, compared with itself). {} when there is no baseline to compare with (a
    pruned job whose dense run is missing). Tags which tasks the average is over, and why the others
    have no stability."""
    if dense_run is None:
        dense_primary, dense_documents = primary, documents
    else:
        # a dense number withheld is no baseline either
        dense_withheld = json.loads(dense_run.data.tags.get(store.WITHHELD_TAG) or "{}")
        dense_primary = {n: None if n in dense_withheld else dense_run.data.metrics.get(f"{n}/{t.primary}")
                         for n, t in scored.items()}
    if not dense_primary:
        return {}
    lower = frozenset(n for n, t in scored.items() if t.lower_is_better)
    metrics, excluded = stability(primary, dense_primary, lower)
    if dense_run is not None:
        dense_documents = {name: per_document(read_records(dense_run.info.run_id, name), scored[name]) for name in primary}
    metrics.update(paired_bootstrap(
        {n: values for n, (_, values) in documents.items()},
        {n: values for n, (_, values) in dense_documents.items()},
        [n for n in primary if n not in excluded], lower,
        {n: statistic for n, (statistic, _) in documents.items()}))
    mlflow.set_tags({"prunebench.stability_tasks": json.dumps([n for n in primary if n not in excluded]),
                     "prunebench.stability_excluded": json.dumps(excluded)})
    return metrics
