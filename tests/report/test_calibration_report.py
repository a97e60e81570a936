"""What calibration does to a result, in the paper layout: a cell's spread over calibration draws
(mean, std, 95% t-interval over seeds) and a sensitivity table when the source or size varies,
checked against the numbers computed here; a cell varying another option is no calibration table."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from scipy.stats import t as student_t

from prunebench.report.calibration import sensitivity, sections
from prunebench.report.table import to_markdown


def result(pruner: str, config: dict, seed: int, task: str, value: float, ratio: float = 0.5) -> dict:
    return {"setting": "m · limit=8", "model": "m", "protocol": "lm_eval", "pruner": pruner,
            "config": json.dumps(config, sort_keys=True), "differs": "", "ratio": ratio, "recovery": "{}",
            "seed": json.dumps({"seed": str(seed)}), "task": task, "metric": "acc", "value": value}


def grid() -> pd.DataFrame:
    rows = [result("none", {}, 0, t, 0.6) for t in ("arc", "piqa")]
    values = {1: [0.40, 0.46, 0.43], 16: [0.50, 0.52, 0.51], 128: [0.55, 0.55, 0.56]}
    for n, draws in values.items():
        for seed, value in enumerate(draws):
            for task, shift in (("arc", 0.0), ("piqa", 0.1)):
                rows.append(result("wanda", {"calib.name": "wikitext2", "calib.n_samples": n}, seed, task, value + shift))
    for alpha, value in ((0.3, 0.5), (0.7, 0.4)):  # another option varies: not a calibration table
        rows.append(result("hies", {"pruner.alpha": alpha, "calib.n_samples": 32}, 0, "arc", value))
    for seed, value in enumerate([0.30, 0.36]):  # the calibration fixed, two draws: its spread
        rows.append(result("sparsegpt", {"calib.name": "c4", "calib.n_samples": 128}, seed, "arc", value))
    return pd.DataFrame(rows), values


def test_sensitivity_over_sizes_and_spread_over_draws():
    results, values = grid()
    long = sensitivity(results)
    assert set(long.pruner) == {"wanda", "sparsegpt"}  # hies varies alpha, the dense run has no calibration
    wanda = long[(long.pruner == "wanda") & (long.task == "arc")].set_index("calibration")
    assert list(wanda.index) == ["n_samples=1", "n_samples=16", "n_samples=128"]
    for n, draws in values.items():
        row = wanda.loc[f"n_samples={n}"]
        mean, std = sum(draws) / 3, pd.Series(draws).std()
        half = student_t.ppf(0.975, 2) * std / math.sqrt(3)
        assert (row["mean"], row["std"], row.draws) == (pytest.approx(mean), pytest.approx(std), 3)
        assert (row.ci_low, row.ci_high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    fixed = long[long.pruner == "sparsegpt"].iloc[0]
    assert fixed.calibration == "(fixed)" and fixed.draws == 2 and fixed["mean"] == pytest.approx(0.33)
    text = "\n\n".join(sections(long, to_markdown))
    assert "### m · limit=8 · wanda · ratio 0.5 (draws per row: 3)" in text
    # rows the calibration in the sweep's order, columns the tasks, x100 as the paper table prints them
    assert "| n_samples=1 | 43.00 ± 3.00 [35.55, 50.45] | 53.00 ± 3.00 [45.55, 60.45] |\n| n_samples=16 | 51.00" in text
