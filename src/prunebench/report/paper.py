"""The paper layout (`prunebench-report --layout paper`): the table a pruning paper prints, with what
a reader needs to trust it.

Rows are pruner x ratio, keyed by the pruner's whole config (every `pruner.*` parameter, and the
calibration for pruners that calibrate) so runs that differ in `alpha` or `normalize` never share a
row; only the seed (and what it draws: MoP's released L/G sequence is its seed's) is averaged, as
mean +- std over seeds. Columns are each task's primary metric (acc for WinoGrande, acc_norm for the
other commonsense tasks, MCC / F1 / Pearson for GLUE: the metric the run's average used) with its
stability beside it, then the average. Runs that each evaluated one task of a suite (a fine-tuned
checkpoint per GLUE task) fill one row together, as in the suite tables.

Against the same model's dense run, per task and pruned run: how many documents flipped (right ->
wrong, wrong -> right) and the exact McNemar test on those discordant pairs; and between two rows at
the same ratio, the same test on their paired documents, so "HIES beats HIS at 30%" has a p-value.
Both read the per-document `predictions/<task>.jsonl` artifacts the jobs log.

Runs that differ only in a recovery fine-tune (`recovery=`, docs/recovery.md) are rows of their own,
"w/o tune" and "w/ tune (<recipe>)" under each pruner and ratio, LLM-Pruner's Table 1 shape; each
recovered row is judged against its unrecovered counterpart too, paired on the same documents."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from hydra.utils import get_class

from prunebench.report import calibration
from prunebench.report.front import speed_front_section
from prunebench.report.plots import grid, panel, single_ratio
from prunebench.report.predictions import Predictions, chance_levels
from prunebench.report.settings import SETTING_KEYS, settings
from prunebench.report.suites import POOLED
from prunebench.report.table import (CSV_FLOATS, DIFFERS, RECOVERY_PREFIXES, SETTING, UNRECOVERED, dense_first,
                                     differences, documents, recipe_labels, recovery_config, results_table,
                                     to_markdown, withheld_note)
from prunebench.report.verdicts import (COLUMNS, compare, compare_perplexity, mcnemar, overall, paired,
                                        with_adjusted)

# what varies between the runs of one row: the seed, and what it draws (MoP's released sequence)
SEED_KEYS = ("seed", "pruner.seed", "calib.seed", "recovery.seed", "pruner.sequence")
# a row never joins runs of two settings (report/settings.py), nor runs differing in anything else
# but the seed (`differs`: a template, say); `recovery`: the recovery's config, "{}" without one
ROW_KEYS = [SETTING, "model", "protocol", "pruner", "config", DIFFERS, "ratio", "recovery"]
# what the pruner's config (the row's label), the recovery's config and the seeds already account for
CONFIG_PREFIXES = (*SEED_KEYS, "pruner.", "calib.", *RECOVERY_PREFIXES)
# the paper table's column of a recovered row's verdict against its unrecovered counterpart
VS_UNTUNED = "vs untuned"


def pruner_config(run: pd.Series) -> dict[str, str]:
    """The parameters that make a pruner what it is: `pruner.*`, and `calib.*` when it calibrates
    (what an uncalibrated pruner was configured with changes none of its numbers)."""
    params = {c[len("params."):]: v for c, v in run.items()
              if c.startswith(("params.pruner.", "params.calib.")) and isinstance(v, str)}
    target = params.get("pruner._target_")
    calibrated = target is not None and get_class(target).needs_calibration
    # `calib.task` is the task whose training split calibrates: in a table of one fine-tuned checkpoint
    # per task it follows the column, like the checkpoint, and is no part of the pruner's config
    return {k: v for k, v in sorted(params.items())
            if k not in SEED_KEYS and k not in ("pruner._target_", "pruner.name") and not k.startswith("calib.task.")
            and (calibrated or not k.startswith("calib."))}


def without_recovery_seed(seed: str) -> str:
    """A row's seeds less the recovery's: what a recovered run shares with its unrecovered counterpart."""
    return json.dumps({k: v for k, v in json.loads(seed).items() if k != "recovery.seed"})


def task_results(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and task: the row's key, the seed, the task's primary metric, its value,
    standard error and stability."""
    rows = []
    # models that each evaluated one task share rows: their setting leaves out the model and its data
    pooled_settings = settings(runs, tuple(k for k in SETTING_KEYS if k not in ("model", "task", "data")))
    keyed = zip(runs.iterrows(), settings(runs), pooled_settings, differences(runs, ignore=CONFIG_PREFIXES))
    for (_, run), heading, pooled, differs in keyed:
        dense = run["tags.prunebench.pruner"] == "none"
        config = {} if dense else pruner_config(run)
        recovery = json.dumps(recovery_config(run))
        protocol = run.get("tags.prunebench.protocol")
        seed = {k: run.get(f"params.{k}") for k in SEED_KEYS if isinstance(run.get(f"params.{k}"), str)}
        # the tasks avg/score averaged (a perplexity beside accuracies is not); no tag: all of them
        averaged = json.loads(run.get("tags.prunebench.avg_tasks") or "null")
        for task, metric in json.loads(run.get("tags.prunebench.avg_metrics") or "{}").items():
            column = f"{task}/{metric}"
            rows.append({SETTING: heading, "pooled": pooled, "model": run["tags.prunebench.model"],
                         "protocol": protocol if isinstance(protocol, str) and protocol else "lm_eval",
                         "pruner": run["tags.prunebench.pruner"], "config": json.dumps(config), DIFFERS: differs,
                         "ratio": float(run["tags.prunebench.sparsity"]), "recovery": recovery,
                         "seed": json.dumps(seed),
                         "task": task, "metric": metric, "value": run.get(f"metrics.{column}"),
                         "stderr": run.get(f"metrics.{column}_stderr"),
                         "stability": run.get(f"metrics.stability/{task}"),
                         "n_docs": run.get(f"metrics.{task}/n_docs"), "run_id": run["run_id"],
                         "averaged": averaged is None or task in averaged})
    results = pd.DataFrame(rows, columns=[*ROW_KEYS, "pooled", "seed", "task", "metric", "value", "stderr",
                                          "stability", "n_docs", "run_id", "averaged"])
    # a model that evaluated one task (one checkpoint per task) shares its rows with the others that did
    tasks_per_model = results.groupby("model").task.nunique()
    single = set(tasks_per_model[tasks_per_model == 1].index)
    # (models that each ran the same one task are rivals, not parts of one row)
    if results[results.model.isin(single)].task.nunique() > 1:
        pool = results.model.isin(single)
        results.loc[pool, SETTING] = [" · ".join([POOLED, p]) for p in results.pooled[pool]]
        results.loc[pool, "model"] = POOLED
    return results.drop(columns="pooled")


def labels(results: pd.DataFrame) -> dict[tuple[str, str], str]:
    """{(pruner, config): label}: the name, and the parameters that tell its configs apart."""
    out = {}
    for pruner, group in results.groupby("pruner"):
        configs = [json.loads(c) for c in group.config.unique()]
        varying = sorted({k for c in configs for k in c if len({d.get(k) for d in configs}) > 1})
        for config in configs:
            shown = ", ".join(f"{k.split('.', 1)[1] if k.startswith('pruner.') else k}={config.get(k)}"
                              for k in varying)
            out[pruner, json.dumps(config)] = pruner + (f" ({shown})" if shown else "")
    return out


def tunes(results: pd.DataFrame) -> dict[str, str]:
    """{recovery config: label}: "w/o tune", "w/ tune (<recipe>)", with the parameters that tell two
    configs of one recipe apart."""
    return {config: f"w/ tune ({label})" if label else "w/o tune"
            for config, label in recipe_labels(results.recovery.unique()).items()}


def recovered(results: pd.DataFrame) -> bool:
    """Whether any run of the report had a recovery fine-tune (else its tables are as before the recovery existed)."""
    return bool((results.recovery != UNRECOVERED).any())


def with_tune(table: pd.DataFrame, results: pd.DataFrame, at: str) -> pd.DataFrame:
    """`table` (with its runs' `recovery` column) with a `tune` column after `at` when any run
    recovered; the `recovery` column dropped."""
    if recovered(results):
        table.insert(table.columns.get_loc(at) + 1, "tune", table.recovery.map(tunes(results)))
    return table.drop(columns="recovery")


def paper_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per setting x model x pruner config x ratio: per task mean, std over seeds, seeds and
    stability; `avg` and `avg stability` over the tasks present (`tasks`: of the setting's)."""
    tables = [setting_table(group) for _, group in results.groupby(SETTING, sort=True)]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=[*ROW_KEYS, "label"])


def setting_table(results: pd.DataFrame) -> pd.DataFrame:
    tasks = list(dict.fromkeys(results.task))
    averaged = [t for t in tasks if t in set(results[results.averaged].task)]
    named = labels(results)
    table = []
    for key, group in results.groupby(ROW_KEYS, sort=False):
        row = dict(zip(ROW_KEYS, key), label=named[key[3], key[4]])
        for task in tasks:
            cell = group[group.task == task]
            if cell.empty:
                continue
            metric = cell.metric.iloc[0]
            spread = cell.stderr.iloc[0] if len(cell) == 1 else cell.value.std() / math.sqrt(len(cell))
            row.update({f"{task}/{metric}": cell.value.mean(), f"{task}/{metric}_std": cell.value.std(),
                        f"{task}/seeds": cell.seed.nunique(), f"{task}/stability": cell.stability.mean(),
                        f"{task}/stderr": spread})
        # as avg/score: a perplexity and an accuracy have no mean
        means = [row[f"{t}/{group[group.task == t].metric.iloc[0]}"] for t in averaged if t in set(group[group.averaged].task)]
        stabilities = [row[f"{t}/stability"] for t in tasks if t in set(group.task)]
        row.update({"avg": sum(means) / len(means), "avg/stability": pd.Series(stabilities).mean(skipna=False),
                    "tasks": f"{len(means)}/{len(averaged)}"})
        table.append(row)
    table = pd.DataFrame(table)
    # LLM-Pruner's Table 1: under each pruner and ratio "w/o tune" first, then each recipe's "w/ tune"
    table = table.sort_values(["model", "protocol", "pruner", "label", DIFFERS, "ratio", "recovery"], key=untuned_first)
    return table.reset_index(drop=True)


def untuned_first(col: pd.Series) -> pd.Series:
    """A sort key: the dense run first (`dense_first`), and under each pruner and ratio the row w/o tune."""
    return col.map(lambda v: "" if v == UNRECOVERED else v) if col.name == "recovery" else dense_first(col)


def task_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c.count("/") == 1 and not c.endswith(("_std", "/seeds", "/stability",
                                                                               "/stderr")) and c != "avg/stability"]


def scale(values: pd.Series) -> float:
    """x100 for metrics on [-1, 1] (accuracy, MCC, F1, correlation), as papers print them; none else."""
    finite = values.dropna()
    return 100.0 if finite.empty or finite.abs().max() <= 1 else 1.0


def printed(table: pd.DataFrame) -> pd.DataFrame:
    """The table as a paper prints it: `mean ± std` (std over seeds, when there are several) and
    stability beside each task."""
    out = pd.DataFrame({"model": table.model, "pruner": table.label, "ratio": table.ratio})
    if (table[DIFFERS] != "").any():
        out.insert(2, DIFFERS, table[DIFFERS])
    if "tune" in table:
        out["tune"] = table.tune
    for column in [c for c in task_columns(table) if table[c].notna().any()]:
        task = column.split("/")[0]
        factor = scale(table[column])
        out[column] = [cell(m * factor, s * factor) for m, s in zip(table[column], table[f"{column}_std"])]
        out[f"{task} stab."] = [cell(v) for v in table[f"{task}/stability"]]
    factor = scale(table.avg)
    out["avg"] = [cell(v * factor) for v in table.avg]
    out["avg stab."] = [cell(v) for v in table["avg/stability"]]
    if (table.tasks != table.tasks.iloc[0]).any():
        out["tasks"] = table.tasks
    if "verdict" in table:
        out["verdict"] = table.verdict
    if VS_UNTUNED in table:
        out[VS_UNTUNED] = table[VS_UNTUNED]
    return out


def cell(mean: float, std: float = float("nan")) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:.2f}" + (f" ± {std:.2f}" if not pd.isna(std) else "")


def to_latex(table: pd.DataFrame, caption: str = "") -> str:
    """A booktabs tabular (\\usepackage{booktabs}); ± as $\\pm$, underscores escaped."""
    def tex(value) -> str:
        return str(value).replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%") \
            .replace("&", "\\&").replace("±", "$\\pm$")
    lines = [f"% {caption}" if caption else "% prunebench-report --layout paper",
             "\\begin{tabular}{" + "l" * 2 + "r" * (len(table.columns) - 2) + "}", "\\toprule",
             " & ".join(tex(c) for c in table.columns) + " \\\\", "\\midrule"]
    lines += [" & ".join(tex(v) for v in row) + " \\\\" for row in table.itertuples(index=False)]
    return "\n".join([*lines, "\\bottomrule", "\\end{tabular}", ""])


def paired_with(r, reference_run: str, predictions: Predictions):
    """(row r, metric counted, the reference run's values, r's values) on the documents (a perplexity's
    windows) both have, by id; None when either run has no per-document values of r's task (a
    regression, a corpus metric) or they share none."""
    mine = predictions.values(r.run_id, r.task, r.metric)
    reference = predictions.values(reference_run, r.task, r.metric)
    if mine is None or reference is None:
        return None
    ref, new = paired(reference[1], mine[1])
    return (r, mine[0], ref, new) if ref else None


def dense_pairs(results: pd.DataFrame, predictions: Predictions):
    """(pruned row, metric counted, dense values, pruned values) per pruned run and task, the
    documents paired by id with the dense run of the same setting and task; a task without
    per-document values (a regression) yields nothing."""
    dense = results[results.pruner == "none"]
    for _, r in results[results.pruner != "none"].iterrows():
        base = dense[(dense[SETTING] == r[SETTING]) & (dense.task == r.task)]
        # the first dense run sharing documents: of several (a perplexity at another seq_len), the one
        # whose windows are r's
        if pair := next(filter(None, (paired_with(r, run_id, predictions) for run_id in base.run_id)), None):
            yield pair


def flips(results: pd.DataFrame, predictions: Predictions) -> pd.DataFrame:
    """Per pruned run and task, against the dense run of the same model and task."""
    named = labels(results)
    rows = []
    for r, metric, ref, new in dense_pairs(results, predictions):
        if isinstance(ref[0], tuple):  # a perplexity's windows: none is right or wrong, so none flips
            continue
        lost, gained, p = mcnemar(ref, new)
        rows.append({SETTING: r[SETTING], "model": r.model, "pruner": named[r.pruner, r.config], "ratio": r.ratio,
                     "recovery": r.recovery, "seed": r.seed,
                     "task": r.task, "metric": metric, "docs": len(ref), "dense": sum(ref) / len(ref),
                     "pruned": sum(new) / len(new), "right->wrong": lost, "wrong->right": gained, "p": p})
    table = pd.DataFrame(rows, columns=[SETTING, "model", "pruner", "ratio", "recovery", "seed", "task", "metric",
                                        "docs", "dense", "pruned", "right->wrong", "wrong->right", "p"])
    table = table.sort_values([SETTING, "model", "pruner", "ratio", "recovery", "task", "seed"], key=untuned_first)
    return with_tune(table, results, "ratio").reset_index(drop=True)


def comparisons(results: pd.DataFrame, predictions: Predictions) -> pd.DataFrame:
    """Every two rows at the same model, ratio and task: the same test on their paired documents
    (a row with several seeds pairs its seeds in order with the other row's, each document once per seed)."""
    named = labels(results)
    rows = []
    pruned = results[results.pruner != "none"]
    tuned = tunes(results) if recovered(results) else {}
    for (setting, model, ratio, task), group in pruned.groupby([SETTING, "model", "ratio", "task"]):
        configs = sorted(dict.fromkeys(zip(group.pruner, group.config, group[DIFFERS], group.recovery)),
                         key=lambda c: (named[c[:2]], c[2], c[3] != UNRECOVERED, c[3]))
        for first, second in itertools.combinations(configs, 2):
            docs = {}
            for side, (pruner, config, differs, recovery) in (("a", first), ("b", second)):
                runs = group[(group.pruner == pruner) & (group.config == config) & (group[DIFFERS] == differs)
                             & (group.recovery == recovery)]
                runs = runs.sort_values("seed")
                docs[side] = [predictions.correct(run_id, task, metric)
                              for run_id, metric in zip(runs.run_id, runs.metric)]
            if any(d is None for d in docs["a"] + docs["b"]):
                continue
            a, b = [], []
            for x, y in zip(docs["a"], docs["b"]):
                xs, ys = paired(x[1], y[1])
                a += xs
                b += ys
            only_a, only_b, p = mcnemar(a, b)
            rows.append({SETTING: setting, "model": model, "ratio": ratio, "task": task, "metric": docs["a"][0][0],
                         "a": " ".join(filter(None, [named[first[:2]], first[2], tuned.get(first[3])])),
                         "b": " ".join(filter(None, [named[second[:2]], second[2], tuned.get(second[3])])),
                         "pairs": len(a),
                         "a correct": sum(a) / len(a),
                         "b correct": sum(b) / len(b), "only a right": only_a, "only b right": only_b, "p": p})
    table = pd.DataFrame(rows, columns=[SETTING, "model", "ratio", "task", "metric", "a", "b", "pairs", "a correct",
                                        "b correct", "only a right", "only b right", "p"])
    return table.sort_values([SETTING, "model", "ratio", "task", "a", "b"]).reset_index(drop=True)


def untuned_pairs(results: pd.DataFrame, predictions: Predictions):
    """As `dense_pairs`, per recovered run and task against its unrecovered counterpart: the run of
    the same setting, model, protocol, pruner config, `differs`, ratio, task and seeds (the
    recovery's own seed aside) without a recovery, documents paired by id. A recovered run without
    such a counterpart yields nothing: runs that differ in anything but the recovery are never paired."""
    keys = [*(k for k in ROW_KEYS if k != "recovery"), "task", "base_seed"]
    results = results.assign(base_seed=results.seed.map(without_recovery_seed))
    untuned = results[results.recovery == UNRECOVERED]
    for _, r in results[results.recovery != UNRECOVERED].iterrows():
        base = untuned[(untuned[keys] == r[keys]).all(axis=1)]
        if not base.empty and (pair := paired_with(r, base.run_id.iloc[0], predictions)):
            yield pair


def judge(reference: list, candidate: list, max_drop: float) -> dict:
    """The verdict row of paired values (report/verdicts.py): a perplexity's windows, (NLL, tokens)
    each, by their pooled perplexity's relative rise; per-document values in points."""
    if reference and isinstance(reference[0], tuple):
        return compare_perplexity(reference, candidate, max_drop)
    return compare(reference, candidate, scale(pd.Series(reference + candidate)), max_drop)


def verdicts(results: pd.DataFrame, pairs, max_drop: float = 1.0, correction: str = "holm") -> pd.DataFrame:
    """A verdict per (row, metric, reference values, candidate values) of `pairs` (report/verdicts.py),
    p adjusted across them (perplexities and accuracies one family); tasks without per-document
    values are left out, as from the flips."""
    named = labels(results)
    rows = [{SETTING: r[SETTING], "model": r.model, "pruner": named[r.pruner, r.config], "ratio": r.ratio,
             "recovery": r.recovery, "seed": r.seed, "task": r.task, "metric": metric,
             **judge(ref, new, max_drop), "run_id": r.run_id}
            for r, metric, ref, new in pairs]
    table = with_adjusted(rows, correction)
    if table.empty:
        table = pd.DataFrame(columns=[SETTING, "model", "pruner", "ratio", "recovery", "seed", *COLUMNS, "run_id"])
    return with_tune(table, results, "ratio")


def dense_verdicts(results: pd.DataFrame, predictions: Predictions, max_drop: float = 1.0,
                   correction: str = "holm") -> pd.DataFrame:
    """Every pruned run x task of a `task_results` against the dense run of its setting."""
    return verdicts(results, dense_pairs(results, predictions), max_drop, correction)


def untuned_verdicts(results: pd.DataFrame, predictions: Predictions, max_drop: float = 1.0,
                     correction: str = "holm") -> pd.DataFrame:
    """Every recovered run x task against its unrecovered counterpart (`untuned_pairs`): `kept`, the
    recovery lost no more than max_drop points; `lost`, it cost more; the gain is `diff` and its interval."""
    return verdicts(results, untuned_pairs(results, predictions), max_drop, correction)


def tolerance(judged: pd.DataFrame, max_drop: float) -> str:
    """The tolerance as a verdicts section's heading says it: points, and a perplexity's relative rise
    in percent (its `diff`) where a perplexity was judged."""
    said = f"tolerance {max_drop:g} points" + (" (a score has at most 100 points to lose: every score is within it)"
                                              if max_drop >= 100 else "")
    return said + (f", a {max_drop:g}% rise for perplexity (diff in %)" if "tokens" in judged else "")


def figure(table: pd.DataFrame, levels: dict[tuple[str, str], float]):
    """One row of panels per setting, each task's metric against the ratio, one line per row config,
    with standard-error bars (the run's own standard error, or the seeds' std / sqrt(seeds)), the
    dense level and chance (`levels`: {(setting, task): level})."""
    sections = [(heading, rows, [c for c in task_columns(rows) if rows[c].notna().any()])
                for heading, rows in table.groupby(SETTING, sort=True)]
    fig, axes = grid([(heading, columns) for heading, _, columns in sections])
    for (heading, rows, columns), row in zip(sections, axes):
        for ax, column in zip(row, columns):
            task = column.split("/")[0]
            # a recovered row is a line of its own, named by its tune ("tune": where any run recovered)
            keys = ["label", DIFFERS, *(["tune"] if "tune" in rows else [])]
            lines = [(" ".join(filter(None, key)), points.ratio.tolist(), points[column].tolist(),
                      points[f"{task}/stderr"].fillna(0).tolist())
                     for key, points in ((key, group.dropna(subset=[column]).sort_values("ratio"))
                                         for key, group in rows[rows.pruner != "none"].groupby(keys))]
            dense = rows[rows.pruner == "none"][column].dropna().tolist()
            panel(ax, lines, dense, levels.get((heading, task)), "ratio", column.split("/")[-1],
                  single_ratio(rows.ratio[rows.pruner != "none"]))
    return fig


def row_verdicts(table: pd.DataFrame, results: pd.DataFrame, judged: pd.DataFrame) -> list[str]:
    """Each row's verdict over its runs' tasks (`overall`), from the per-run verdicts `judged`."""
    by_run = judged.groupby("run_id").verdict.apply(list).to_dict()
    runs_of = results.groupby(ROW_KEYS, sort=False).run_id.apply(lambda ids: list(dict.fromkeys(ids))).to_dict()
    return [overall([v for run in runs_of[tuple(row[k] for k in ROW_KEYS)] for v in by_run.get(run, [])])
            for _, row in table.iterrows()]


def write_paper(runs: pd.DataFrame, out: Path, max_drop: float = 1.0, correction: str = "holm") -> list[str]:
    """paper.{md,csv,tex}, flips.{md,csv}, comparisons.{md,csv}, verdicts.csv, calibration.csv (a sweep
    over calibration draws, sources or sizes: report/calibration.py), paper.png, and where runs
    recovered, verdicts_tune.csv (each recovered run against its unrecovered counterpart); returns
    the Markdown sections: one table per setting, headed by it and by how many documents each task
    rests on, each row with its verdict against the dense run (report/verdicts.py) and, recovered,
    against the same row w/o tune."""
    results = task_results(runs)
    table = paper_table(results)
    tuned = recovered(results)
    predictions = Predictions()
    flipped, compared = flips(results, predictions), comparisons(results, predictions)
    judged = dense_verdicts(results, predictions, max_drop, correction)
    if not judged.empty:
        table["verdict"] = row_verdicts(table, results, judged)
    untuned = untuned_verdicts(results, predictions, max_drop, correction) if tuned else pd.DataFrame()
    if tuned:
        # the dense baseline is not recovered (its run key leaves recovery out): no "w/o tune" beside it
        table.insert(table.columns.get_loc("recovery") + 1, "tune",
                     table.recovery.map(tunes(results)).where(table.pruner != "none", ""))
        if not untuned.empty:
            table[VS_UNTUNED] = row_verdicts(table, results, untuned)
            table.loc[table.recovery == UNRECOVERED, VS_UNTUNED] = ""
        untuned.to_csv(out / "verdicts_tune.csv", index=False, float_format=CSV_FLOATS)
    (table if tuned else table.drop(columns="recovery")).to_csv(out / "paper.csv", index=False,
                                                                  float_format=CSV_FLOATS)
    flipped.to_csv(out / "flips.csv", index=False, float_format=CSV_FLOATS)
    compared.to_csv(out / "comparisons.csv", index=False, float_format=CSV_FLOATS)
    judged.to_csv(out / "verdicts.csv", index=False, float_format=CSV_FLOATS)
    calibrated = calibration.sensitivity(results)
    calibrated.to_csv(out / "calibration.csv", index=False, float_format=CSV_FLOATS)
    sections, tex = ["## Paper layout"], []
    for heading, rows in table.groupby(SETTING, sort=True):
        shown = printed(rows.reset_index(drop=True))
        counts = results[results[SETTING] == heading].groupby("task", sort=False).n_docs.apply(list).to_dict()
        sections.append("\n\n".join(filter(None, [f"### {heading}", documents(counts), to_markdown(shown)])))
        tex.append(to_latex(shown, heading))
    sections += filter(None, [withheld_note(runs)])
    (out / "paper.tex").write_text("\n".join(tex))
    several = table[SETTING].nunique() > 1  # which setting a test belongs to, when the tables are several
    if not flipped.empty:
        dropped = ([] if several else [SETTING]) + (["seed"] if flipped.seed.nunique() == 1 else [])
        shown_flips = flipped.drop(columns=dropped)
        sections.append(f"## Flips against the dense run (exact McNemar p)\n\n{to_markdown(shown_flips)}")
    if not compared.empty:
        shown_compared = compared if several else compared.drop(columns=SETTING)
        sections.append("## Row against row at the same ratio (exact McNemar p)\n\n" + to_markdown(shown_compared))
    name = "Holm" if correction == "holm" else "Benjamini-Hochberg"
    if not judged.empty:
        shown_judged = judged.drop(columns=([] if several else [SETTING]) + ["run_id"]
                                   + (["seed"] if judged.seed.nunique() == 1 else []))
        sections.append(f"## Verdicts against the dense run ({tolerance(judged, max_drop)}; p adjusted by {name} "
                        f"across the {len(judged)} comparisons)\n\n{to_markdown(shown_judged)}")
    if not untuned.empty:
        shown_untuned = untuned.drop(columns=([] if several else [SETTING]) + ["run_id"]
                                     + (["seed"] if untuned.seed.nunique() == 1 else []))
        sections.append(f"## Verdicts against the unrecovered run (w/ tune against w/o tune on the same documents; "
                        f"{tolerance(untuned, max_drop)}; p adjusted by {name} across the {len(untuned)} comparisons)"
                        f"\n\n{to_markdown(shown_untuned)}")
    if not calibrated.empty:
        sections.append("## Calibration: across draws and sources (mean ± std [95% t-interval over draws])\n\n"
                        + "\n\n".join(calibration.sections(calibrated, to_markdown)))
    # the flat report beside it drew speed_front.png from the same runs
    sections += filter(None, [speed_front_section(results_table(runs))[0]])
    (out / "paper.md").write_text("\n\n".join(sections) + "\n")
    if table.empty:  # every task's number withheld (withheld_note): nothing to plot
        return sections
    dense = results[results.pruner == "none"]
    fig = figure(table, chance_levels(zip(dense[SETTING], dense.task, dense.run_id)))
    fig.savefig(out / "paper.png", dpi=110)
    plt.close(fig)
    return sections
