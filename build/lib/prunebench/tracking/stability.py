"""Stability = how much of the dense model's quality a pruned model keeps, in percent."""

from __future__ import annotations


def stability(pruned: dict[str, float], dense: dict[str, float], lower_is_better: frozenset[str] = frozenset()
              ) -> dict[str, float]:
    """pruned / dense x 100 per task (dense / pruned for lower-is-better metrics such as perplexity,
    so 100 always means "kept everything"), and their mean as `stability/avg`."""
    out = {}
    for task, value in pruned.items():
        base = dense.get(task)
        if base is None:
            continue
        num, den = (base, value) if task in lower_is_better else (value, base)
        out[f"stability/{task}"] = 100.0 * num / den if den else float("nan")
    if out:
        out["stability/avg"] = sum(out.values()) / len(out)
    return out
