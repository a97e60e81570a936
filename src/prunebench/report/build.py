"""A report folder: results.md, results.csv and the plots, for an experiment or one sweep."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import pandas as pd

from prunebench.report import plots
from prunebench.report.front import speed_front_section
from prunebench.report.predictions import chance_levels
from prunebench.report.settings import settings
from prunebench.report.suites import suite_tables
from prunebench.report.table import (CSV_FLOATS, SETTING, documents, failed_jobs, load_runs, results_table,
                                     shown_columns, task_columns, to_markdown, withheld_note)


LAYOUTS = ("flat", "paper")


def write_report(experiment: str, sweep_run_id: str | None, out: Path, suites: list[str] | None = None,
                 layout: str = "flat", max_drop: float = 1.0, correction: str = "holm") -> Path:
    """`suites`: the suites to average across single-task runs (None: each with runs of two of its tasks).
    `layout="paper"` adds the paper's table, flips, comparisons and verdicts against the dense run within
    `max_drop` points, p adjusted by `correction` (report/paper.py, verdicts.py) to the flat report.
    One table per setting (report/settings.py), headed by it and by each task's documents."""
    runs = load_runs(experiment, sweep_run_id)
    failed = failed_jobs(experiment, sweep_run_id, runs)
    # a grid with holes says where and why, not only in the parent's counts
    failures = [f"## Failed jobs ({len(failed)})\n\n{to_markdown(failed)}"] if not failed.empty else []
    if runs.empty:
        if not failures:
            raise LookupError(f"experiment {experiment!r} has no FINISHED prunebench runs"
                              + (f" in sweep {sweep_run_id}" if sweep_run_id else ""))
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("No FINISHED job.\n\n" + "\n\n".join(failures) + "\n")
        return out
    table = results_table(runs)
    summaries = suite_tables(runs, suites)
    out.mkdir(parents=True, exist_ok=True)
    sections = [setting_section(heading, rows) for heading, rows in table.groupby(SETTING, sort=True)]
    sections += filter(None, [withheld_note(runs)])
    for suite, summary in summaries.items():
        sections += [f"## {suite}: averaged across single-task runs · {heading}\n\n{to_markdown(rows[shown_columns(rows)])}"
                     for heading, rows in summary.groupby(SETTING, sort=True)]
        summary.to_csv(out / f"suite_{suite}.csv", index=False, float_format=CSV_FLOATS)
    if "stability/avg" not in table:
        sections.append(no_stability(runs))
    front_md, front = speed_front_section(table)
    curves = recovery_curves(runs)
    if curves:
        sections.append(f"## Recovery fine-tuning\n\n{len(curves)} recovered runs: training loss per optimizer step, "
                        "validation loss where logged\n\n![recovery loss per step](recovery_loss.png)")
    sections += [front_md, *failures] if front_md else failures
    (out / "results.md").write_text("\n\n".join(sections) + "\n")
    table.to_csv(out / "results.csv", index=False, float_format=CSV_FLOATS)
    dense = table[table.pruner == "none"]
    levels = chance_levels((heading, column.split("/")[0], run_id) for column in task_columns(dense)
                           for heading, run_id, value in zip(dense[SETTING], dense.run_id, dense[column])
                           if pd.notna(value))
    # every task's number withheld (withheld_note) leaves nothing to plot
    figures = {"metric_vs_sparsity.png": plots.metric_vs_sparsity(table, task_columns(table), levels)
               } if task_columns(table) else {}
    for suite, summary in summaries.items():
        complete = summary[~summary.partial]  # an average over fewer tasks is no point on the same curve
        if not complete.empty:
            figures[f"suite_{suite}_vs_sparsity.png"] = plots.metric_vs_sparsity(
                complete, [c for c in ("avg/score", "stability/avg") if c in complete])
    if "stability/avg" in table:
        figures["stability_vs_sparsity.png"] = plots.stability_vs_sparsity(table, levels)
    if front is not None:
        figures["speed_front.png"] = front
    if curves:
        figures["recovery_loss.png"] = plots.recovery_loss(curves)
    if any(column.startswith(plots.LAYER_SPARSITY) for column in runs.columns):  # OWL's per-layer sparsities
        figures["layer_sparsity.png"] = plots.layer_sparsity(runs)
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    if layout == "paper":
        from prunebench.report.paper import write_paper

        write_paper(runs, out, max_drop, correction)
    return out


def recovery_curves(runs: pd.DataFrame) -> list[tuple[str, str, dict[str, list[tuple[int, float]]]]]:
    """(setting, `pruner ratio recipe`, {metric: [(step, value)]}) per recovered run (tag
    prunebench.recovery), from its metric history: the losses the recovery logged per step."""
    if "tags.prunebench.recovery" not in runs:
        return []
    client, curves = mlflow.MlflowClient(), []
    for (_, run), heading in zip(runs.iterrows(), settings(runs)):
        if not isinstance(run["tags.prunebench.recovery"], str):
            continue
        label = " ".join([run["tags.prunebench.pruner"], f"{float(run['tags.prunebench.sparsity']):g}",
                          run["tags.prunebench.recovery"]])
        history = {name: [(m.step, m.value) for m in client.get_metric_history(run.run_id, name)]
                   for name in plots.RECOVERY_LOSSES}
        curves.append((heading, label, history))
    return sorted(curves, key=lambda c: c[:2])


def setting_section(heading: str, rows) -> str:
    """`## <setting>`, how many documents each task rests on, and its rows."""
    counts = {c.split("/")[0]: rows.get(f"{c.split('/')[0]}/n_docs", pd.Series(dtype=float)).tolist()
              for c in task_columns(rows) if rows[c].notna().any()}
    return "\n\n".join(filter(None, [f"## {heading}", documents(counts), to_markdown(rows[shown_columns(rows)])]))


def no_stability(runs) -> str:
    """Why the report has no stability column or plot, from the reasons each job logged."""
    reasons = {}
    for _, run in runs.iterrows():
        excluded = run.get("tags.prunebench.stability_excluded")
        for task, reason in (json.loads(excluded) if isinstance(excluded, str) else {}).items():
            reasons.setdefault(f"{task}: {reason}", None)
    why = "; ".join(reasons) or "no run has a FINISHED dense run of its model and task to compare with"
    return f"No stability column or plot: no run logged stability/avg ({why})."


def latest_sweep(experiment: str) -> str | None:
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string="tags.`prunebench.sweep` = 'true'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return None if runs.empty else runs.run_id[0]
