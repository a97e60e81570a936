"""Stability = how much of the dense model's quality a pruned model keeps, in percent.

The papers define it as pruned / dense x 100 (dense / pruned for perplexity, so 100 always means
"kept everything"). That ratio only means something when the dense value is clearly above zero:
MCC, Pearson and Spearman are 0 at chance and can be negative (dense -0.05, pruned -0.10 would read
200), and a dense accuracy of 0.001 makes any pruned value look like a gain of thousands. So a task
whose dense value is below DEFINED_ABOVE gets no stability: it is left out of `stability/avg`, and
the job says which tasks entered the average and why the others did not. Nothing here returns NaN."""

from __future__ import annotations

import math
import warnings

import numpy as np

from prunebench.api.metrics import BOOTSTRAP_ITERS

# how a draw of documents (draws x documents, with a trailing (nll, count) axis for the summed
# ratios) becomes the task's number, named as lm-eval names its aggregations: a mean of per-document
# values; perplexity over the pooled tokens (ours, and lm-eval's weighted_perplexity); exp of the
# mean NLL (lm-eval's `perplexity`, LAMBADA's); bits per byte over the pooled bytes
STATISTICS = {
    "mean": lambda v: v.mean(axis=1),
    "weighted_perplexity": lambda v: np.exp(v[..., 0].sum(axis=1) / v[..., 1].sum(axis=1)),
    "perplexity": lambda v: np.exp(v.mean(axis=1)),
    "bits_per_byte": lambda v: v[..., 0].sum(axis=1) / v[..., 1].sum(axis=1) / math.log(2),
}

# metrics here live in [0, 1] or [-1, 1]; a dense value under 0.05 is within noise of chance for
# the signed ones (MCC's standard error on CoLA's 1043 dev sentences is ~0.03) and near zero for the rest
DEFINED_ABOVE = 0.05


def undefined_reason(dense: float | None, lower_is_better: bool) -> str | None:
    if dense is None or math.isnan(dense):
        return "no dense value"
    if lower_is_better:
        return None if dense > 0 else f"dense value {dense:.4g} is not positive"
    if dense < DEFINED_ABOVE:
        return f"dense value {dense:.4g} < {DEFINED_ABOVE}: at or near chance, so pruned / dense is meaningless"
    return None


def stability(pruned: dict[str, float], dense: dict[str, float], lower_is_better: frozenset[str] = frozenset()
              ) -> tuple[dict[str, float], dict[str, str]]:
    """(`stability/<task>` per task with a defined ratio and their mean `stability/avg`, {task: why
    it has none}). A NaN pruned value (a failed metric) also has none."""
    out, excluded = {}, {}
    for task, value in pruned.items():
        base = dense.get(task)
        reason = undefined_reason(base, task in lower_is_better)
        if reason is None and (value is None or math.isnan(value)):
            reason = "no pruned value"
        if reason is None and task in lower_is_better and value <= 0:
            reason = f"pruned value {value:.4g} is not positive"
        if reason:
            excluded[task] = reason
            continue
        num, den = (base, value) if task in lower_is_better else (value, base)
        out[f"stability/{task}"] = 100.0 * num / den
    if out:
        out["stability/avg"] = sum(out.values()) / len(out)
    return out, excluded


def resample(pruned: list, dense: list, statistic: str, draws: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray]:
    """(the pruned side's number, the dense side's) on each of `draws` resamples of the documents,
    each drawn with both its values (paired); `pruned[i]` and `dense[i]` are one document's values,
    `statistic` a name in STATISTICS. Shared by the stability intervals and the report's perplexity
    verdicts (report/verdicts.py), so both resample alike."""
    p, d = np.asarray(pruned, dtype=float), np.asarray(dense, dtype=float)
    index = rng.integers(0, len(p), (draws, len(p)))
    return STATISTICS[statistic](p[index]), STATISTICS[statistic](d[index])


def paired_bootstrap(pruned: dict[str, dict], dense: dict[str, dict], tasks: list[str],
                     lower_is_better: frozenset[str] = frozenset(), statistics: dict[str, str] | None = None,
                     draws: int = BOOTSTRAP_ITERS, level: float = 0.95, seed: int = 1234) -> dict[str, float]:
    """`stability/<task>_ci_low` / `_ci_high` (and `stability/avg_ci_*` when every task of the
    average has one): the percentile interval of the stability ratio over resamples of the
    documents, each document drawn with its pruned and its dense value together (paired: the two
    models answered the same questions, so their errors are not independent and the interval is
    far narrower than two separate standard errors would suggest).

    Each draw computes the task's own number from the drawn documents (`statistics[task]`, a name
    in STATISTICS, "mean" by default: perplexity is exp of the summed NLL over the summed tokens,
    not a mean of per-window perplexities) and the ratio the point estimate uses: pruned / dense x
    100, or dense / pruned x 100 for a task in `lower_is_better`, so the interval brackets the
    logged stability. `pruned` / `dense`: {task: {doc_id: the document's value}}, a float for a
    mean, an (nll, count) pair for a summed ratio; a task whose metric has no per-document values
    (MCC) is not among them and gets no interval. Tasks are resampled independently; the average's
    interval averages each draw's ratios. A draw whose denominator is not positive has no ratio
    and is left out of the percentiles. A fixed seed: a rerun logs the same bounds."""
    rng = np.random.default_rng(seed)
    tail = 100 * (1 - level) / 2
    out, draws_per_task = {}, []
    for task in tasks:
        docs = sorted(set(pruned.get(task, {})) & set(dense.get(task, {})), key=str)
        if not docs:
            continue
        num, den = resample([pruned[task][d] for d in docs], [dense[task][d] for d in docs],
                            (statistics or {}).get(task, "mean"), draws, rng)
        if task in lower_is_better:
            num, den = den, num
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(den > 0, 100 * num / den, np.nan)
        draws_per_task.append(ratios)
        out[f"stability/{task}_ci_low"], out[f"stability/{task}_ci_high"] = map(
            float, np.nanpercentile(ratios, [tail, 100 - tail]))
    if tasks and len(draws_per_task) == len(tasks):
        with warnings.catch_warnings():  # a draw where every task's dense mean is 0 has no average: left out
            warnings.simplefilter("ignore", RuntimeWarning)
            average = np.nanmean(np.stack(draws_per_task), axis=0)
        out["stability/avg_ci_low"], out["stability/avg_ci_high"] = map(
            float, np.nanpercentile(average, [tail, 100 - tail]))
    return out
