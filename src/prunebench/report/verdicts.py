"""Verdicts a reviewer accepts, on the paired per-document results the jobs keep.

Per pruned run and task, against a reference run on the same documents (the dense run, or run A of
`prunebench-compare`): the paired difference in points (x100 for metrics on [-1, 1], as papers print
them), its 95% interval (for 0/1 values Bonett and Price's adjusted Wald interval of a paired
proportion, which stays honest with no discordant pair, where the plain Wald interval is [0, 0]; else
mean difference +- z x sd / sqrt(n)), the exact McNemar p for 0/1 values or a paired bootstrap p
otherwise, that p adjusted across every comparison of the report (Holm by default, Benjamini-
Hochberg as `bh`), and a verdict against the tolerance `max_drop` (points):
- `kept`: the interval's lower end is above -max_drop, and the minimum detectable difference is
  within max_drop;
- `lost`: its upper end is below -max_drop;
- `inconclusive` otherwise, with the minimum detectable difference at this many documents (two-sided
  5%, 80% power) and the documents at which the interval would exclude -max_drop, were the
  difference and its spread what they are now.
The verdict reads the unadjusted interval (the tolerance is a margin, not a null hypothesis); the
adjusted p says which differences from the reference survive the whole sweep's multiplicity.
A perplexity (windows, no document right or wrong) is compared by its pooled perplexity instead:
the relative rise in percent, a paired bootstrap interval and p over the windows, max_drop read as a
rise in percent (`compare_perplexity`), its p adjusted in the same family."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import binomtest, false_discovery_control, norm

from prunebench.tracking.stability import STATISTICS, resample


CORRECTIONS = ("holm", "bh")
LEVEL, POWER = 0.95, 0.8
VERDICTS = ("kept", "inconclusive", "lost")
# resamples of the paired bootstrap p for non-binary per-document values, seeded so a report is repeatable
BOOTSTRAP_DRAWS, SEED = 10_000, 1234
COLUMNS = ["task", "metric", "docs", "reference", "candidate", "diff", "ci_low", "ci_high", "test", "p", "p_adj",
           "mdd", "docs_to_settle", "verdict"]


def mcnemar(a: list[float], b: list[float]) -> tuple[int, int, float]:
    """(a right and b wrong, a wrong and b right, exact two-sided McNemar p): the binomial test of
    the discordant pairs, exact at any count (the chi-square form is not, below a few dozen)."""
    only_a = sum(x > 0.5 >= y for x, y in zip(a, b))
    only_b = sum(y > 0.5 >= x for x, y in zip(a, b))
    n = only_a + only_b
    return only_a, only_b, (binomtest(only_a, n, 0.5).pvalue if n else 1.0)


def paired(first: dict, second: dict) -> tuple[list, list]:
    """The values of the documents both have, by id; a perplexity's windows ((NLL, tokens)) by id and
    token count, since window i of another length (another seq_len) is another window."""
    docs = [d for d in sorted(set(first) & set(second))
            if not isinstance(first[d], tuple) or first[d][1] == second[d][1]]
    return [first[d] for d in docs], [second[d] for d in docs]


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment (scipy has Benjamini-Hochberg but not Holm): the k-th smallest p
    times the m - k + 1 hypotheses left, made monotone, capped at 1."""
    order = np.argsort(p, kind="stable")
    adjusted, running = np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def adjust(p: list[float], correction: str = "holm") -> list[float]:
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}; valid: {list(CORRECTIONS)}")
    if not p:
        return []
    return holm(p) if correction == "holm" else false_discovery_control(p, method="bh").tolist()


def paired_test(reference: list[float], candidate: list[float]) -> tuple[str, float]:
    """(test name, two-sided p): exact McNemar on the discordant pairs of 0/1 values; otherwise the
    paired bootstrap, the share of resampled mean differences, centred on the observed one, at least
    as far from 0 as the observed one."""
    if set(reference) | set(candidate) <= {0.0, 1.0}:
        return "mcnemar", mcnemar(reference, candidate)[2]
    d = np.asarray(candidate, dtype=float) - np.asarray(reference, dtype=float)
    draws = np.random.default_rng(SEED).integers(0, len(d), (BOOTSTRAP_DRAWS, len(d)))
    means = d[draws].mean(axis=1)
    return "paired bootstrap", float(np.mean(np.abs(means - d.mean()) >= abs(d.mean()) - 1e-12))


def spread(reference: list[float], candidate: list[float], factor: float) -> tuple[float, float, float]:
    """(centre, standard error, documents the error is over) of the paired difference, in points.
    0/1 values: Bonett and Price's adjusted Wald interval for paired proportions (2012), one more
    document lost and one more gained over n + 2, so that with no discordant pair the interval does
    not collapse to [0, 0] (2 documents and no flip leave +-69 points; 2,000 leave +-0.14). Other
    values: the mean difference and sd / sqrt(n)."""
    d = (np.asarray(candidate, dtype=float) - np.asarray(reference, dtype=float)) * factor
    n = len(d)
    if set(reference) | set(candidate) <= {0.0, 1.0}:
        lost, gained, _ = mcnemar(reference, candidate)
        p_lost, p_gained = (lost + 1) / (n + 2), (gained + 1) / (n + 2)
        variance = p_lost + p_gained - (p_gained - p_lost) ** 2
        return (p_gained - p_lost) * factor, math.sqrt(variance / (n + 2)) * factor, n + 2
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    return float(d.mean()), sd / math.sqrt(n), n


def decide(centre: float, low: float, high: float, se: float, n: int, effective: float, max_drop: float
           ) -> dict:
    """The minimum detectable difference, the documents that would settle it and the verdict, for a
    difference where higher is better (a perplexity's rise enters negated). `kept` needs the interval
    above -max_drop and a minimum detectable difference within max_drop: what the data cannot detect
    is not called kept."""
    z, z_power = norm.ppf(1 - (1 - LEVEL) / 2), norm.ppf(POWER)
    mdd = (z + z_power) * se
    verdict = ("kept" if low > -max_drop and mdd <= max_drop else "lost" if high < -max_drop
               else "inconclusive")
    # the documents at which the interval's half-width would reach the gap to -max_drop, and the minimum
    # detectable difference max_drop, the spread per document as now (se^2 x effective documents)
    # (spread / tolerance) squared, not spread squared / tolerance squared: --max-drop 1e308 squared overflows
    gap = abs(centre + max_drop)
    needed = max((z * se / gap) ** 2 * effective if gap > 0 else math.inf,
                 ((z + z_power) * se / max_drop) ** 2 * effective if max_drop > 0 else math.inf)
    # None: no number of documents settles it (a zero tolerance, a centre exactly at -max_drop)
    settle = n if verdict != "inconclusive" else math.ceil(needed - (effective - n)) if math.isfinite(needed) else None
    return {"mdd": mdd, "docs_to_settle": settle, "verdict": verdict}


def compare(reference: list[float], candidate: list[float], factor: float, max_drop: float) -> dict:
    """The row of one comparison (documents paired by id already), p not yet adjusted."""
    d = (np.asarray(candidate, dtype=float) - np.asarray(reference, dtype=float)) * factor
    n, mean = len(d), float(d.mean())
    centre, se, effective = spread(reference, candidate, factor)
    z = norm.ppf(1 - (1 - LEVEL) / 2)
    low, high = centre - z * se, centre + z * se
    test, p = paired_test(reference, candidate)
    return {"docs": n, "reference": float(np.mean(reference)) * factor, "candidate": float(np.mean(candidate)) * factor,
            "diff": mean, "ci_low": low, "ci_high": high, "test": test, "p": p,
            **decide(centre, low, high, se, n, effective, max_drop)}


def compare_perplexity(reference: list[tuple[float, int]], candidate: list[tuple[float, int]], max_drop: float
                       ) -> dict:
    """The row of one perplexity comparison, over windows paired already ((NLL, tokens) each): the
    pooled perplexity exp(sum NLL / sum tokens) of each side, `diff` the candidate's relative rise over
    the reference in percent (lower is better: a loss of quality is a rise), its 95% percentile
    interval and a two-sided p from the paired bootstrap of the windows (`tracking.stability.resample`,
    seeded), p = 2 x (1 + the resamples on the far side of 0) / (draws + 1), capped at 1. `max_drop`
    reads as a relative rise in percent, and the verdict is `compare`'s on the rise negated: `kept`,
    the interval's upper end below +max_drop and the detectable rise within it; `lost`, its lower end
    above +max_drop. The minimum detectable rise takes the resampled rises' sd as the standard error
    (a window's NLL and tokens do not split into per-document differences)."""
    num, den = resample(candidate, reference, "weighted_perplexity", BOOTSTRAP_DRAWS, np.random.default_rng(SEED))
    rises = 100 * (num / den - 1)
    pooled = [float(STATISTICS["weighted_perplexity"](np.asarray([side], dtype=float))[0])
              for side in (reference, candidate)]
    diff = 100 * (pooled[1] / pooled[0] - 1)
    low, high = map(float, np.percentile(rises, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2]))
    far = min(int((rises <= 0).sum()), int((rises >= 0).sum()))
    n = len(reference)
    return {"docs": n, "tokens": int(sum(tokens for _, tokens in reference)), "reference": pooled[0],
            "candidate": pooled[1], "diff": diff, "ci_low": low, "ci_high": high, "test": "paired bootstrap (ppl)",
            "p": min(1.0, 2 * (1 + far) / (BOOTSTRAP_DRAWS + 1)),
            **decide(-diff, -high, -low, float(rises.std(ddof=1)), n, n, max_drop)}


def with_adjusted(rows: list[dict], correction: str) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    if "tokens" in table:  # a perplexity's windows: the tokens they hold, beside their count
        table.insert(table.columns.get_loc("docs") + 1, "tokens", table.pop("tokens").astype("Int64"))
    table.insert(table.columns.get_loc("p") + 1, "p_adj", adjust(table.p.tolist(), correction))
    return table


def overall(verdicts: list[str]) -> str:
    """A row's verdict over its tasks and seeds: lost if any is lost, kept if all are kept."""
    if not verdicts:
        return ""
    return "lost" if "lost" in verdicts else "kept" if all(v == "kept" for v in verdicts) else "inconclusive"


def exit_code(verdicts: list[str]) -> int:
    """For a CI job: 0 every comparison kept, 1 any lost, 2 some inconclusive and none lost."""
    return 1 if "lost" in verdicts else 2 if "inconclusive" in verdicts else 0
