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


def test_paired_bootstrap_interval_holds_the_ratio_and_pairs_documents():
    from prunebench.tracking.stability import paired_bootstrap

    dense = {"a": {i: float(i % 2) for i in range(200)}}  # 0.5
    same = paired_bootstrap(dense, dense, ["a"])
    # the same answers on every document: every draw's ratio is exactly 100
    assert same == {"stability/a_ci_low": 100.0, "stability/a_ci_high": 100.0,
                    "stability/avg_ci_low": 100.0, "stability/avg_ci_high": 100.0}
    pruned = {"a": {i: float(i % 2 and i % 10 != 1) for i in range(200)}}  # loses 1 in 5 right answers: 80
    bounds = paired_bootstrap(pruned, dense, ["a"])
    assert bounds["stability/a_ci_low"] < 80 < bounds["stability/a_ci_high"] <= 100
    # paired: the pruned model only ever loses answers, so no draw can reach 100 ...
    assert bounds["stability/a_ci_high"] < 100
    # ... where the same values shuffled between documents (unpaired) would: wider on both sides
    shuffled = {"a": dict(zip(range(200), reversed(list(pruned["a"].values()))))}
    unpaired = paired_bootstrap(shuffled, dense, ["a"])
    assert unpaired["stability/a_ci_high"] - unpaired["stability/a_ci_low"] > \
        bounds["stability/a_ci_high"] - bounds["stability/a_ci_low"]
    assert paired_bootstrap(pruned, dense, ["a"]) == bounds  # seeded: a rerun logs the same bounds


def test_a_task_without_per_document_values_has_no_interval_and_no_average_interval():
    from prunebench.tracking.stability import paired_bootstrap

    docs = {"a": {0: 1.0, 1: 0.0}}
    bounds = paired_bootstrap(docs, docs, ["a", "mcc_task"])
    assert set(bounds) == {"stability/a_ci_low", "stability/a_ci_high"}
