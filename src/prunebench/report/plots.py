"""Plots of a results table: quality vs sparsity, stability vs sparsity, quality vs measured speedup."""

from __future__ import annotations

import itertools
import logging
import math
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

from prunebench.report.table import DIFFERS, SETTING, task_columns as task_columns_of  # noqa: E402

log = logging.getLogger(__name__)


def _settings(table: pd.DataFrame):
    """(heading, rows) per setting: runs of other settings share no panel (report/settings.py); a
    table without settings (a suite's averages) per model at least."""
    key = SETTING if SETTING in table else "model" if "model" in table else None
    if key is None:
        yield "", table
        return
    for heading, rows in table.groupby(key, sort=True):
        yield heading, rows


def _series(rows: pd.DataFrame, column: str):
    """One line per pruner (and `differs`: runs of other parameters are other lines; and recovery
    recipe, where any run recovered), each starting
    from the setting's dense point (the dense run of the same `differs` when there are several)."""
    dense = rows[rows.pruner == "none"]
    keys = ["pruner", *([DIFFERS] if DIFFERS in rows else []), *(["recovery"] if "recovery" in rows else [])]
    for key, group in rows[rows.pruner != "none"].groupby(keys, sort=True):
        base = dense if len(dense) == 1 else dense[dense[DIFFERS] == key[1]] if DIFFERS in rows else dense[:0]
        points = pd.concat([base[:1], group]).dropna(subset=[column]).sort_values("sparsity")
        yield " ".join(k for k in key if k), points


def title_and_rest(heading: str) -> tuple[str, str]:
    """A setting's heading (report/settings.py) split into the panel title's model and task, and the
    rest (limit, data, dtype, ...: the caption's). A suite's task keeps its name in the title and
    its list of tasks, with the whole override, in the rest."""
    title, rest = [], []
    for part in heading.split(" · ") if heading else []:
        if "=" not in part:  # the model (or the pooled checkpoints' name)
            title.append(part)
        elif part.startswith("task="):
            name = part[len("task="):]
            title.append(name.split(" (")[0])
            rest += [part] if " (" in name else []
        else:
            rest.append(part)
    return " · ".join(title), " · ".join(rest)


# the caption's font size (points), and how many of its characters one inch of a line holds
CAPTION_FONT, CAPTION_CHARS_PER_INCH = 7, 16


def grid(rows: list[tuple[str, list[str]]]):
    """A figure of one row of panels per setting, one panel per title. A panel's title is two
    lines, the setting's model and task and its own title, as a panel's width holds; the rest of
    the setting (limit, data, dtype, numerics, protocol), which made titles of four lines, is the
    caption under the figure, a number tying each row of panels to its line when there are several
    (settings may differ in the caption alone). The figure lays itself out when drawn, the caption
    kept clear of the panels."""
    columns = max(len(titles) for _, titles in rows)
    split = [title_and_rest(heading) for heading, _ in rows]
    numbered = len(rows) > 1
    width = 4.5 * columns
    caption = [line for i, (_, rest) in enumerate(split) if rest
               for line in textwrap.wrap(f"({i + 1}) {rest}" if numbered else rest,
                                         int(width * CAPTION_CHARS_PER_INCH), subsequent_indent="    ")]
    caption_in = (len(caption) * CAPTION_FONT * 1.4 + 8) / 72 if caption else 0.0
    height = 3.9 * len(rows) + caption_in
    fig, axes = plt.subplots(len(rows), columns, figsize=(width, height), squeeze=False)
    for (_, titles), (title, _), row, i in zip(rows, split, axes, itertools.count(1)):
        for ax in row[len(titles):]:
            fig.delaxes(ax)
        for ax, panel_title in zip(row, titles):
            head = f"({i}) {title}" if numbered else title
            ax.set_title("\n".join([*textwrap.wrap(head, 60), panel_title]), fontsize=8)
    if caption:
        fig.text(0.01, 4 / 72 / height, "\n".join(caption), fontsize=CAPTION_FONT, ha="left", va="bottom")
    fig.set_layout_engine("tight", rect=(0, caption_in / height, 1, 1))
    return fig, [row[:len(titles)] for (_, titles), row in zip(rows, axes)]


def single_ratio(ratios: pd.Series) -> float | None:
    """The ratio of a sweep at one ratio (`ratios`: the pruned runs'), else None."""
    unique = ratios.dropna().unique()
    return float(unique[0]) if len(unique) == 1 else None


def panel(ax, lines, dense: list[float], chance: float | None, xlabel: str, ylabel: str,
          at: float | None = None) -> None:
    """`lines`: (label, x, y, yerr) each with standard-error (or interval) bars; the dense levels
    dashed and chance dotted, so a difference smaller than the bars or a value at chance shows.
    `at`: the one ratio of a sweep at one ratio. Its methods then stand side by side, one point
    each with its bar, named on the x axis: lines from the dense point to one ratio say nothing a
    point does not and lie on top of each other, and one x value leaves an axis of nothing."""
    if at is None:
        for label, xs, ys, yerr in lines:
            ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=label)
    else:
        points = [(label, ys[xs.index(at)], _at(yerr, xs.index(at))) for label, xs, ys, yerr in lines if at in xs]
        for i, (_, y, yerr) in enumerate(points):
            ax.errorbar([i], [y], yerr=yerr, marker="o", capsize=3, ls="none")
        names = [label for label, _, _ in points]
        crowded = max(map(len, names), default=0) * len(names) > 50  # more than a panel's width holds level
        ax.set_xticks(range(len(points)), names, rotation=30 if crowded else 0, ha="right" if crowded else "center",
                      fontsize=8)
        ax.set_xlim(-0.6, len(points) - 0.4)
        xlabel = f"method at {xlabel} {at:g}"
    for value in dense:
        ax.axhline(value, color="black", lw=1, ls="--", label="dense")
    if chance is not None and not math.isnan(chance):
        ax.axhline(chance, color="grey", lw=1, ls=":", label="chance")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=7)


def _at(yerr, i: int):
    """Point i's bar of a line's `yerr`: none, symmetric (a value per point) or (below, above) lists."""
    if yerr is None:
        return None
    return [[yerr[0][i]], [yerr[1][i]]] if isinstance(yerr[0], list) else [yerr[i]]


def _errors(points: pd.DataFrame, column: str):
    stderr = f"{column}_stderr"
    return points[stderr].fillna(0).tolist() if stderr in points else None


def interval_errors(points: pd.DataFrame, column: str) -> list[list[float]]:
    """Error bars (below, above) from `<column>_ci_low` / `_ci_high`. An interval that does not
    hold its point (a run logged before perplexity's interval followed its ratio's direction) is
    a wrong number: its bar is left off and the run named in the log, and the report still builds."""
    nan = pd.Series(float("nan"), points.index)
    low, high = (points.get(f"{column}_ci_{side}", nan) for side in ("low", "high"))
    below, above = points[column] - low, high - points[column]
    wrong = (below < 0) | (above < 0)
    for _, row in points[wrong].iterrows():
        log.warning("%s interval [%.4g, %.4g] does not hold its value %.4g (run %s, %s at %s): no error bar drawn",
                    column, row[f"{column}_ci_low"], row[f"{column}_ci_high"], row[column], row.get("run_id", "?"),
                    row.get("pruner", "?"), row.get("sparsity", "?"))
    return [below.where(~wrong).fillna(0).tolist(), above.where(~wrong).fillna(0).tolist()]


def metric_vs_sparsity(table: pd.DataFrame, task_columns: list[str],
                       chance: dict[tuple[str, str], float] | None = None):
    """One row of panels per setting, one panel per task it evaluated; `chance`: {(setting, task): level}."""
    sections = [(heading, rows, [c for c in task_columns if c in rows and rows[c].notna().any()])
                for heading, rows in _settings(table)]
    sections = [section for section in sections if section[2]]
    fig, axes = grid([(heading, columns) for heading, _, columns in sections])
    for (heading, rows, columns), row in zip(sections, axes):
        for ax, column in zip(row, columns):
            lines = [(label, points.sparsity.tolist(), points[column].tolist(), _errors(points, column))
                     for label, points in _series(rows, column)]
            dense = rows[rows.pruner == "none"][column].dropna().tolist()
            panel(ax, lines, dense, (chance or {}).get((heading, column.split("/")[0])), "sparsity",
                  column.split("/")[-1], single_ratio(rows.sparsity[rows.pruner != "none"]))
    return fig


def stability_vs_sparsity(table: pd.DataFrame, chance: dict[tuple[str, str], float] | None = None):
    """One panel per setting; bars: the paired bootstrap interval of `stability/avg` where logged.
    Chance in stability units: each task's chance level over its dense value x 100, averaged."""
    sections = [(heading, rows) for heading, rows in _settings(table) if rows["stability/avg"].notna().any()]
    fig, axes = grid([(heading, ["stability (pruned / dense x 100)"]) for heading, _ in sections])
    for (heading, rows), (ax,) in zip(sections, axes):
        lines = []
        for label, points in _series(rows, "stability/avg"):
            lines.append((label, points.sparsity.tolist(), points["stability/avg"].tolist(),
                          interval_errors(points, "stability/avg")))
        dense = rows[rows.pruner == "none"]
        levels = [100 * (chance or {})[heading, column.split("/")[0]] / dense[column].iloc[0]
                  for column in task_columns_of(rows) if (heading, column.split("/")[0]) in (chance or {})
                  and len(dense) and dense[column].iloc[0] > 0]
        panel(ax, lines, [100.0], sum(levels) / len(levels) if levels else None, "sparsity", "stability/avg",
              single_ratio(rows.sparsity[rows.pruner != "none"]))
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both speedup and quality (ties kept once), fastest last."""
    front, best = [], float("-inf")
    for speedup, quality in sorted(points, key=lambda p: (-p[0], -p[1])):
        if quality > best:
            front.append((speedup, quality))
            best = quality
    return front[::-1]


def speed_front(table: pd.DataFrame, quality: str = "avg/score"):
    """Quality against measured speed, one panel per setting (runs of two models, task sets or
    dtypes never share one): each run a point at its measured speedup over the dense run
    (`latency/speedup`), `quality` with its standard-error bar, a marker per pruner and its ratio
    beside each point (in the axis label when the sweep has one), the dense point and the Pareto front (its points ringed). Returns the
    figure (None when no run was timed) and the runs that have a quality but no latency, named by
    the caller under the plot, never dropped without a word."""
    has_quality = table.dropna(subset=[quality])
    untimed = has_quality[has_quality.get("latency/speedup", pd.Series(float("nan"), has_quality.index)).isna()]
    timed = has_quality.drop(untimed.index)
    if timed.empty:
        return None, untimed
    sections = list(_settings(timed))
    fig, axes = grid([(heading, [f"{quality} vs measured speedup"]) for heading, _ in sections])
    markers = dict(zip(sorted(timed.pruner.unique()), itertools.cycle("o^sDvP*Xh<>")))
    stderr = f"{quality}_stderr"
    for (_, rows), (ax,) in zip(sections, axes):
        at = single_ratio(rows.sparsity[rows.pruner != "none"])
        for pruner, group in rows.groupby("pruner", sort=True):
            errors = group[stderr].fillna(0).tolist() if stderr in group else None
            ax.errorbar(group["latency/speedup"], group[quality], yerr=errors, ls="none",
                        marker="*" if pruner == "none" else markers[pruner], ms=11 if pruner == "none" else 6,
                        color="black" if pruner == "none" else None, capsize=3,
                        label="dense" if pruner == "none" else pruner)
            if pruner != "none" and at is None:  # a marker per pruner: which ratio a point is, beside it
                for x, y, ratio in zip(group["latency/speedup"], group[quality], group.sparsity):
                    ax.annotate(f"{ratio:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        front = pareto_front(list(zip(rows["latency/speedup"], rows[quality])))
        # ringed, so that a front of one point (no line to draw) still shows
        ax.plot([p[0] for p in front], [p[1] for p in front], color="grey", lw=1, ls="--", marker="o", ms=13,
                mfc="none", label="Pareto front")
        ax.set(xlabel="speedup over dense (measured)" if at is None else f"measured speedup over dense (sparsity {at:g})",
               ylabel=quality)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig, untimed


LAYER_SPARSITY = "metrics.sparsity/layer_"


def layer_sparsity(runs: pd.DataFrame):
    """OWL's figure from the runs that logged a sparsity per layer (`sparsity/layer_<i>`, from
    MLflow's runs): a row per model, a panel per target sparsity, each run's layers as a line
    against the uniform target (dashed), and the layers' outlier ratios (`outliers/layer_<i>`) as
    grey bars behind where logged."""
    columns = sorted((c for c in runs.columns if c.startswith(LAYER_SPARSITY)), key=lambda c: int(c.rsplit("_", 1)[1]))
    layers = [int(c.rsplit("_", 1)[1]) for c in columns]
    runs = runs.dropna(subset=columns, how="all")
    models = [(model, sorted(rows.groupby("tags.prunebench.sparsity"), key=lambda item: float(item[0])))
              for model, rows in runs.groupby("tags.prunebench.model", sort=True)]
    fig, axes = grid([(model, [f"target sparsity {target}" for target, _ in targets]) for model, targets in models])
    for (_, targets), row in zip(models, axes):
        for ax, (target, rows) in zip(row, targets):
            outliers = rows.reindex(columns=[f"metrics.outliers/layer_{i}" for i in layers]).dropna(how="all")
            if not outliers.empty:
                bars = ax.twinx()
                bars.bar(layers, outliers.iloc[0].astype(float), color="grey", alpha=0.3)
                bars.set_ylabel("outlier ratio (%)", fontsize=8)
                ax.set_zorder(bars.get_zorder() + 1)  # the lines over the bars
                ax.patch.set_visible(False)
            for _, run in rows.sort_values("tags.prunebench.pruner").iterrows():
                ax.plot(layers, run[columns].astype(float), marker=".", label=run["tags.prunebench.pruner"])
            ax.axhline(float(target), color="black", lw=1, ls="--", label="uniform")
            ax.set(xlabel="layer", ylabel="sparsity")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no layer 0.5
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return fig


RECOVERY_LOSSES = ("recovery/train_loss", "recovery/val_loss")
RECOVERY_PANELS = ("training loss (the recipe's objective)", "validation loss (next-token)")


def recovery_loss(curves: list[tuple[str, str, dict[str, list[tuple[int, float]]]]]):
    """The recovery fine-tunes' losses against the optimizer step (docs/recovery.md), one line per
    recovered run (`curves`: (setting, label, {metric: [(step, value)]})): a row of panels per
    setting (the losses of two models share no axis), the training loss in one panel and the
    validation loss in another where logged, since distillation's training loss is a KL divergence
    and only the validation loss is the same next-token loss for every recipe."""
    sections = [(heading, [c for c in curves if c[0] == heading]) for heading in sorted({c[0] for c in curves})]
    panels = [[(name, title) for name, title in zip(RECOVERY_LOSSES, RECOVERY_PANELS)
               if any(history.get(name) for _, _, history in rows)] for _, rows in sections]
    fig, axes = grid([(heading, [title for _, title in shown]) for (heading, _), shown in zip(sections, panels)])
    for (_, rows), shown, row in zip(sections, panels, axes):
        for ax, (name, _) in zip(row, shown):
            for _, label, history in rows:
                if history.get(name):
                    ax.plot(*zip(*sorted(history[name])), marker="o", ms=3, label=label)
            ax.set(xlabel="optimizer step", ylabel=name)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return fig
