"""Quality against measured speedup: a panel per setting, the Pareto front flagged, and the runs
without a latency measurement named, never dropped."""

from __future__ import annotations

import math

import pandas as pd

from prunebench.report.front import speed_front_section


def table() -> pd.DataFrame:
    rows = [("m · limit=8", "none", 0.0, 0.70, 0.02, 1.0, "d1"), ("m · limit=8", "sleb", 0.2, 0.60, 0.03, 1.25, "s1"),
            ("m · limit=8", "flap", 0.2, 0.62, 0.03, 1.15, "f1"), ("m · limit=8", "flap", 0.5, 0.50, 0.03, 1.1, "f2"),
            ("m · limit=8", "width_amp", 0.5, 0.55, 0.03, math.nan, "w1"),
            ("n · limit=8", "none", 0.0, 0.80, 0.02, 1.0, "d2"), ("n · limit=8", "sleb", 0.3, 0.40, 0.04, 1.6, "s2")]
    return pd.DataFrame(rows, columns=["setting", "pruner", "sparsity", "avg/score", "avg/score_stderr",
                                       "latency/speedup", "run_id"]).assign(model="m", task="t")


def test_front_per_setting_flags_the_undominated_runs_and_names_the_untimed():
    markdown, fig = speed_front_section(table())
    assert len(fig.axes) == 2  # two settings: never one panel
    first = markdown.split("### m · limit=8")[1].split("###")[0]
    rows = [row for row in first.splitlines() if row.startswith("|")][2:]
    flags = {line.split("|")[-2].strip(): line.split("|")[-3].strip() for line in rows}
    # flap 0.5 (1.1x, 0.50) is beaten by flap 0.2 (1.15x, 0.62); the rest are each best at their speed
    assert flags == {"d1": "True", "s1": "True", "f1": "True", "f2": "False"}
    assert "no latency measured (`bench=none`): width_amp 0.5 (w1)" in markdown
    (bars,) = [c for c in fig.axes[0].containers if c.get_label() == "sleb"]
    assert bars.has_yerr


def test_no_latency_column_means_no_section():
    assert speed_front_section(table().drop(columns="latency/speedup")) == ("", None)


def test_a_front_of_one_point_shows_and_each_point_names_its_ratio():
    """A front of one point is no line: ringed, it still shows. A pruner's points share a marker,
    so each names its ratio; a setting at one ratio names it once, on the axis."""
    rows = table()
    rows.loc[rows.run_id == "s2", "latency/speedup"] = 0.9  # slower and worse than dense: the front is dense alone
    _, fig = speed_front_section(rows)
    several, single = fig.axes
    (front,) = [line for line in single.get_lines() if line.get_label() == "Pareto front"]
    assert list(front.get_xdata()) == [1.0] and front.get_marker() == "o"
    assert single.get_xlabel() == "measured speedup over dense (sparsity 0.3)" and not single.texts
    assert sorted(t.get_text() for t in several.texts) == ["0.2", "0.2", "0.5"]  # width_amp 0.5: untimed
