"""Stability is pruned / dense x 100 only where that ratio means something, and never NaN."""

from __future__ import annotations

import math

import pytest

from prunebench.tracking.stability import stability


def test_ratio_for_metrics_clearly_above_zero_and_inverse_for_perplexity():
    values, excluded = stability({"arc": 0.3, "ppl": 40.0}, {"arc": 0.6, "ppl": 20.0}, frozenset({"ppl"}))
    assert values == {"stability/arc": 50.0, "stability/ppl": 50.0, "stability/avg": 50.0}
    assert excluded == {}


@pytest.mark.parametrize(("dense", "pruned"), [(-0.05, -0.10), (0.001, 0.02), (0.0, 0.3), (0.0, 0.0)])
def test_signed_or_near_zero_dense_values_get_no_stability_and_stay_out_of_the_average(dense, pruned):
    values, excluded = stability({"cola": pruned, "sst2": 0.8}, {"cola": dense, "sst2": 0.9})
    assert values == {"stability/sst2": pytest.approx(800 / 9), "stability/avg": pytest.approx(800 / 9)}
    assert set(excluded) == {"cola"} and "chance" in excluded["cola"]


def test_nothing_defined_logs_no_average_and_no_nan():
    values, excluded = stability({"emoji": 0.0, "gk": float("nan")}, {"emoji": 0.0, "gk": 0.4})
    assert values == {} and set(excluded) == {"emoji", "gk"}
    assert not any(math.isnan(v) for v in values.values())


def test_missing_dense_values_are_said():
    values, excluded = stability({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": None})
    assert values == {"stability/a": 100.0, "stability/avg": 100.0}
    assert excluded == {"b": "no dense value"}
