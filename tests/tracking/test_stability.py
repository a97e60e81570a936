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


def test_a_lower_is_better_interval_is_of_dense_over_pruned_and_holds_the_point():
    """Perplexity pools its windows' tokens (exp of summed NLL over summed tokens); its interval is
    of dense / pruned x 100, the direction of the logged stability."""
    from prunebench.tracking.stability import paired_bootstrap, stability

    windows = range(60)
    dense = {"ppl": {w: (2.0 * (1 + w % 3), 10 + w % 7) for w in windows}}
    pruned = {"ppl": {w: (nll * 1.3 + 0.1 * (w % 5), n) for w, (nll, n) in dense["ppl"].items()}}

    def corpus(values):
        return math.exp(sum(v[0] for v in values.values()) / sum(v[1] for v in values.values()))

    point = stability({"ppl": corpus(pruned["ppl"])}, {"ppl": corpus(dense["ppl"])}, frozenset({"ppl"}))[0]
    bounds = paired_bootstrap(pruned, dense, ["ppl"], frozenset({"ppl"}), {"ppl": "weighted_perplexity"})
    assert point["stability/ppl"] < 100
    assert bounds["stability/ppl_ci_low"] <= point["stability/ppl"] <= bounds["stability/ppl_ci_high"] < 100
    # a lower-is-better mean (an lm-eval metric whose higher_is_better is false) turns the same way
    errors = {"e": {i: 0.2 + 0.1 * (i % 3) for i in range(50)}}
    worse = {"e": {i: v * 1.5 + 0.05 * (i % 4) for i, v in errors["e"].items()}}
    mean_point = stability({"e": sum(worse["e"].values()) / 50}, {"e": sum(errors["e"].values()) / 50},
                           frozenset({"e"}))[0]["stability/e"]
    mean_bounds = paired_bootstrap(worse, errors, ["e"], frozenset({"e"}))
    assert mean_bounds["stability/e_ci_low"] <= mean_point <= mean_bounds["stability/e_ci_high"] < 100


@pytest.mark.lm_eval
def test_statistics_equal_lm_evals_own_aggregations():
    """The resampled statistic of each lm-eval aggregation a lower-is-better metric uses is lm-eval's
    own function of the same items (log-likelihood items become NLL in document_values)."""
    metrics = pytest.importorskip("lm_eval.api.metrics")
    import numpy as np

    from prunebench.tracking.stability import STATISTICS

    items = [(-3.5, 4), (-10.25, 9), (-0.75, 2), (-6.0, 5)]
    pairs = np.array([[(-ll, n) for ll, n in items]])
    for name in ("weighted_perplexity", "bits_per_byte"):
        assert STATISTICS[name](pairs)[0] == pytest.approx(getattr(metrics, name)(items), rel=1e-12)
    lls = [ll for ll, _ in items]
    assert STATISTICS["perplexity"](np.array([[-ll for ll in lls]]))[0] == pytest.approx(metrics.perplexity(lls), rel=1e-12)


def test_a_plot_whose_interval_misses_its_point_leaves_the_bar_off_and_still_builds(caplog):
    """A run logged before the fix carries an interval of the other ratio: the report still builds,
    without that bar, and names the run."""
    import pandas as pd

    from prunebench.report import plots

    # two ratios, so the plot is a line against sparsity (one ratio draws methods side by side)
    table = pd.DataFrame({"model": ["m"] * 3, "pruner": ["none", "heads_random", "heads_random"],
                          "sparsity": [0.0, 0.3, 0.5], "run_id": ["d", "p", "q"], "stability/avg": [100.0, 12.85, 10.0],
                          "stability/avg_ci_low": [100.0, 668.8, 8.0], "stability/avg_ci_high": [100.0, 906.2, 12.0]})
    with caplog.at_level("WARNING"):
        fig = plots.stability_vs_sparsity(table)
    (ax,) = fig.axes
    lower, upper = ax.containers[0].lines[2][0].get_segments()[1][:, 1]
    assert lower == upper == 12.85  # no bar drawn for the wrong interval
    assert "does not hold its value 12.85 (run p" in caplog.text
