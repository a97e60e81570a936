"""Plots of a results table: quality vs sparsity, stability vs sparsity, latency vs quality."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def _series(table: pd.DataFrame, column: str):
    """One line per (model, pruner), each starting from its model's dense point at sparsity 0."""
    dense = table[table.pruner == "none"]
    for (model, pruner), rows in table[table.pruner != "none"].groupby(["model", "pruner"], sort=True):
        points = pd.concat([dense[dense.model == model], rows]).dropna(subset=[column]).sort_values("sparsity")
        label = pruner if table.model.nunique() == 1 else f"{model} {pruner}"
        yield label, points.sparsity.tolist(), points[column].tolist()


def metric_vs_sparsity(table: pd.DataFrame, task_columns: list[str]):
    fig, axes = plt.subplots(1, len(task_columns), figsize=(4.5 * len(task_columns), 3.6), squeeze=False)
    for ax, column in zip(axes[0], task_columns):
        for label, xs, ys in _series(table, column):
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=column, xlabel="sparsity", ylabel=column.split("/")[-1])
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    return fig


def stability_vs_sparsity(table: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for label, xs, ys in _series(table, "stability/avg"):
        ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set(title="stability (pruned / dense x 100)", xlabel="sparsity", ylabel="stability/avg")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both lower latency and higher quality."""
    front, best = [], float("-inf")
    for latency, quality in sorted(points, key=lambda p: (p[0], -p[1])):
        if quality > best:
            front.append((latency, quality))
            best = quality
    return front


def latency_vs_quality(table: pd.DataFrame):
    rows = table.dropna(subset=["latency/median_s", "avg/score"])
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for pruner, group in rows.groupby("pruner"):
        ax.scatter(group["latency/median_s"], group["avg/score"], label=pruner)
    front = pareto_front(list(zip(rows["latency/median_s"], rows["avg/score"])))
    ax.plot([p[0] for p in front], [p[1] for p in front], color="black", lw=1, ls="--", label="Pareto front")
    ax.set(title="latency vs quality", xlabel="latency/median_s", ylabel="avg/score")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
