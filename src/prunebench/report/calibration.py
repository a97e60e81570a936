"""What calibration does to a result, from a sweep over it: the spread across calibration draws
(seeds) of one cell, and a sensitivity table when the calibration source or size varies (the Wanda
paper's sample-count figure as a table). Read from `paper.task_results`: each run's row key, seed,
task and primary metric; a run's pruner config holds its `calib.*` parameters when it calibrates."""

from __future__ import annotations

import json
import math

import pandas as pd
from scipy.stats import t as student_t

from prunebench.report.table import DIFFERS, SETTING

LEVEL = 0.95
# one cell of a sensitivity table: a pruner at a ratio in one setting (and recovery: runs recovered
# and not are never draws of one cell), its calibration varying
CELL_KEYS = [SETTING, "model", "protocol", "pruner", DIFFERS, "ratio", "recovery"]


def over_draws(values: pd.Series) -> dict[str, float]:
    """Mean, standard deviation and the 95% t-interval of the mean over the draws (seeds); a single
    draw has no spread, so its std and interval are NaN rather than a false 0."""
    k, mean = len(values), float(values.mean())
    std = float(values.std()) if k > 1 else math.nan
    half = student_t.ppf(1 - (1 - LEVEL) / 2, k - 1) * std / math.sqrt(k) if k > 1 else math.nan
    return {"mean": mean, "std": std, "draws": k, "ci_low": mean - half, "ci_high": mean + half}


def calibration_label(config: str) -> dict[str, str]:
    return {k: v for k, v in json.loads(config).items() if k.startswith("calib.")}


def sensitivity(results: pd.DataFrame) -> pd.DataFrame:
    """Long form, one row per cell x calibration x task: the mean, std and interval over draws.
    A cell enters when its runs differ in a calibration parameter and in nothing else of the
    pruner's config (so a row is the calibration, never another option); `calibration` names the
    parameters that vary within the cell. A cell whose calibration is fixed enters when it has
    several draws (its spread across seeds)."""
    pruned = results[results.pruner != "none"].dropna(subset=["value"])
    rows = []
    for key, cell in pruned.groupby(CELL_KEYS, sort=True):
        configs = {c: json.loads(c) for c in cell.config.unique()}
        keys = {k for c in configs.values() for k in c}
        varying = sorted(k for k in keys if len({json.dumps(c.get(k)) for c in configs.values()}) > 1)
        if any(not k.startswith("calib.") for k in varying):
            continue
        if not varying and cell.groupby("task").seed.nunique().max() < 2:
            continue
        for (config, task, metric), runs in cell.groupby(["config", "task", "metric"], sort=False):
            label = ", ".join(f"{k.split('.', 1)[1]}={configs[config].get(k)}" for k in varying) or "(fixed)"
            rows.append({**dict(zip(CELL_KEYS, key)), "calibration": label, "task": task, "metric": metric,
                         **over_draws(runs.value)})
    return pd.DataFrame(rows, columns=[*CELL_KEYS, "calibration", "task", "metric", "mean", "std", "draws",
                                       "ci_low", "ci_high"])


def printed_cell(row) -> str:
    factor = 100.0 if abs(row["mean"]) <= 1 else 1.0  # as the paper table prints accuracies
    text = f"{row['mean'] * factor:.2f}"
    if row.draws > 1:
        text += f" ± {row['std'] * factor:.2f} [{row.ci_low * factor:.2f}, {row.ci_high * factor:.2f}]"
    return text


def sections(long: pd.DataFrame, markdown) -> list[str]:
    """Per cell, a table: rows the calibration, columns the tasks, each `mean ± std [95% interval
    over draws]` with the draws counted in the heading."""
    out = []
    for key, cell in long.groupby(CELL_KEYS, sort=True):
        setting, model, _, pruner, differs, ratio, recovery = key
        tune = json.loads(recovery).get("recovery.name")
        wide = cell.assign(shown=[printed_cell(r) for _, r in cell.iterrows()]).pivot(
            index="calibration", columns="task", values="shown").reindex(cell.calibration.unique())
        draws = sorted(set(cell.draws))
        heading = " · ".join(filter(None, [setting, pruner, differs, f"ratio {ratio:g}",
                                           tune and f"w/ tune ({tune})"]))
        out.append(f"### {heading} (draws per row: {', '.join(map(str, draws))})\n\n"
                   f"{markdown(wide.reset_index())}")
    return out
