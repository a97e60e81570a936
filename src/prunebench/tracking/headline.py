"""A run's headline numbers: which tasks have one (a judged task whose judge failed too often is
withheld), their average, and the one line a sweep's log shows per job."""

from __future__ import annotations

import json
import logging
import math

import mlflow

from prunebench.tracking.store import WITHHELD_TAG

log = logging.getLogger(__name__)


def average(primary: dict[str, float], scored: dict, metrics: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """(`avg/score` and, where every task has one, its standard error; the tasks averaged). A
    perplexity and an accuracy have no mean: where both ran, the average is the accuracies'."""
    averaged = [n for n in primary if not scored[n].lower_is_better] or list(primary)
    if not averaged:
        return {}, []
    out = {"avg/score": sum(primary[n] for n in averaged) / len(averaged)}
    errors = [metrics.get(f"{n}/{scored[n].primary}_stderr", math.nan) for n in averaged]
    if not any(math.isnan(e) for e in errors):  # the tasks' documents are independent samples
        out["avg/score_stderr"] = math.sqrt(sum(e * e for e in errors)) / len(errors)
    return out, averaged


def withheld_tasks(tasks: dict, metrics: dict[str, float]) -> dict[str, str]:
    """{task: why it has no headline number} for the tasks that say so (a judged task whose judge
    failed on more than judge.max_failure_rate of its gradings), recorded in the run's
    `prunebench.withheld` tag for the reports to name. Its metrics stay logged, for inspection."""
    withheld = {name: reason for name, task in tasks.items()
                if hasattr(task, "withheld") and (reason := task.withheld(metrics))}
    for name, reason in withheld.items():
        log.warning("task %s gets no headline number: %s", name, reason)
    if withheld:
        mlflow.set_tag(WITHHELD_TAG, json.dumps(withheld))
    return withheld

def summary(metrics: dict[str, float], tasks: dict, withheld: dict[str, str]) -> str:
    """The numbers a sweep's reader scans for: each task's primary metric (the first few; `withheld`
    for one with no headline number), then the averages and what the pruning achieved."""
    keys = {f"{name}/{task.primary}": name for name, task in tasks.items() if task.metrics}
    shown = [f"{key}=withheld" if name in withheld else f"{key}={metrics[key]:.4g}" for key, name in list(keys.items())[:4]]
    if len(keys) > 4:
        shown.append(f"... {len(keys) - 4} more")
    shown += [f"{key}={metrics[key]:.4g}" for key in ("avg/score", "stability/avg", "sparsity/actual") if key in metrics]
    return " ".join(shown)
