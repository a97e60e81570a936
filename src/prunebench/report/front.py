"""Quality against measured speed, the question a pruning paper answers: each run's quality at the
speedup our latency benchmark measured over its dense run, and which runs no other run beats."""

from __future__ import annotations

import pandas as pd

from prunebench.report.plots import pareto_front, speed_front
from prunebench.report.table import SETTING, to_markdown

QUALITY = "avg/score"


def speed_front_section(table: pd.DataFrame, quality: str = QUALITY) -> tuple[str, object]:
    """(Markdown, figure or None) from a `results_table`: per setting, each timed run's speedup and
    quality (with its standard error and how many runs it rests on), whether it is on the Pareto
    front; then the runs with a quality but no latency measurement, by name. ("", None) when the
    sweep timed nothing and asked for no timing (no `latency/speedup` column at all)."""
    if "latency/speedup" not in table or quality not in table:
        return "", None
    fig, untimed = speed_front(table, quality)
    parts = ["## Quality against measured speedup"]
    for heading, rows in table.dropna(subset=[quality, "latency/speedup"]).groupby(SETTING, sort=True):
        front = set(pareto_front(list(zip(rows["latency/speedup"], rows[quality]))))
        shown = pd.DataFrame({"pruner": rows.pruner, "sparsity": rows.sparsity, "speedup": rows["latency/speedup"],
                              quality: rows[quality],
                              "stderr": rows.get(f"{quality}_stderr", pd.Series(float("nan"), rows.index)),
                              "front": [(x, y) in front for x, y in zip(rows["latency/speedup"], rows[quality])],
                              "run_id": rows.run_id})
        parts.append(f"### {heading}\n\n{to_markdown(shown)}")
    if fig is not None:
        parts.append("![quality against measured speedup](speed_front.png)")
    if not untimed.empty:
        names = ", ".join(f"{r.pruner} {r.sparsity:g} ({r.run_id})" for r in untimed.itertuples())
        parts.append(f"Not on the plot, no latency measured (`bench=none`): {names}.")
    return "\n\n".join(parts), fig
