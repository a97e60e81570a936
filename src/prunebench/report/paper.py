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
Both read the per-document `predictions/<task>.jsonl` artifacts the jobs log."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import pandas as pd
from hydra.utils import get_class
from scipy.stats import binomtest

from prunebench.report.suites import POOLED
from prunebench.report.table import dense_first, to_markdown

# what varies between the runs of one row: the seed, and what it draws (MoP's released sequence)
SEED_KEYS = ("seed", "pruner.seed", "calib.seed", "pruner.sequence")
ROW_KEYS = ["model", "protocol", "pruner", "config", "ratio"]


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


def task_results(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and task: the row's key, the seed, the task's primary metric, its value,
    standard error and stability."""
    rows = []
    for _, run in runs.iterrows():
        dense = run["tags.prunebench.pruner"] == "none"
        config = {} if dense else pruner_config(run)
        protocol = run.get("tags.prunebench.protocol")
        seed = {k: run.get(f"params.{k}") for k in SEED_KEYS if isinstance(run.get(f"params.{k}"), str)}
        for task, metric in json.loads(run.get("tags.prunebench.avg_metrics") or "{}").items():
            column = f"{task}/{metric}"
            rows.append({"model": run["tags.prunebench.model"],
                         "protocol": protocol if isinstance(protocol, str) and protocol else "lm_eval",
                         "pruner": run["tags.prunebench.pruner"], "config": json.dumps(config),
                         "ratio": float(run["tags.prunebench.sparsity"]), "seed": json.dumps(seed),
                         "task": task, "metric": metric, "value": run.get(f"metrics.{column}"),
                         "stderr": run.get(f"metrics.{column}_stderr"),
                         "stability": run.get(f"metrics.stability/{task}"), "run_id": run["run_id"]})
    results = pd.DataFrame(rows, columns=[*ROW_KEYS, "seed", "task", "metric", "value", "stderr", "stability",
                                          "run_id"])
    # a model that evaluated one task (one checkpoint per task) shares its rows with the others that did
    tasks_per_model = results.groupby("model").task.nunique()
    single = set(tasks_per_model[tasks_per_model == 1].index)
    if len(single) > 1:
        results["model"] = results.model.map(lambda m: POOLED if m in single else m)
    return results


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


def paper_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per model x pruner config x ratio: per task mean, std over seeds, seeds and stability;
    `avg` and `avg stability` over the tasks present."""
    tasks = list(dict.fromkeys(results.task))
    named = labels(results)
    table = []
    for key, group in results.groupby(ROW_KEYS, sort=False):
        row = dict(zip(ROW_KEYS, key), label=named[key[2], key[3]])
        for task in tasks:
            cell = group[group.task == task]
            if cell.empty:
                continue
            metric = cell.metric.iloc[0]
            spread = cell.stderr.iloc[0] if len(cell) == 1 else cell.value.std() / math.sqrt(len(cell))
            row.update({f"{task}/{metric}": cell.value.mean(), f"{task}/{metric}_std": cell.value.std(),
                        f"{task}/seeds": cell.seed.nunique(), f"{task}/stability": cell.stability.mean(),
                        f"{task}/stderr": spread})
        means = [row[f"{t}/{group[group.task == t].metric.iloc[0]}"] for t in tasks if t in set(group.task)]
        stabilities = [row[f"{t}/stability"] for t in tasks if t in set(group.task)]
        row.update({"avg": sum(means) / len(means), "avg/stability": pd.Series(stabilities).mean(skipna=False),
                    "tasks": f"{len(means)}/{len(tasks)}"})
        table.append(row)
    table = pd.DataFrame(table)
    table = table.sort_values(["model", "protocol", "pruner", "label", "ratio"], key=dense_first)
    return table.reset_index(drop=True)


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
    if table.protocol.nunique() > 1:
        out.insert(1, "protocol", table.protocol)
    for column in task_columns(table):
        task = column.split("/")[0]
        factor = scale(table[column])
        out[column] = [cell(m * factor, s * factor) for m, s in zip(table[column], table[f"{column}_std"])]
        out[f"{task} stab."] = [cell(v) for v in table[f"{task}/stability"]]
    factor = scale(table.avg)
    out["avg"] = [cell(v * factor) for v in table.avg]
    out["avg stab."] = [cell(v) for v in table["avg/stability"]]
    if (table.tasks != table.tasks.iloc[0]).any():
        out["tasks"] = table.tasks
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


def read_predictions(run_id: str, task: str) -> list[dict]:
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"predictions/{task}.jsonl")
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Predictions:
    """Per-document correctness of a run's task, read once from its `predictions/<task>.jsonl`."""

    def __init__(self):
        self.cache: dict[tuple[str, str, str], tuple[str, dict] | None] = {}

    def correct(self, run_id: str, task: str, metric: str) -> tuple[str, dict] | None:
        """(the metric counted, {doc_id: 0/1}): the record's own value of the metric (acc, acc_norm,
        exact_match), else pred == gold, accuracy, for a classifier whose column is a corpus metric
        (MCC, F1: no document has one); None for a regression or a task without documents (perplexity)."""
        key = (run_id, task, metric)
        if key not in self.cache:
            records = read_predictions(run_id, task)
            if records and metric in records[0]:
                self.cache[key] = metric, {r["doc_id"]: float(r[metric]) for r in records}
            elif records and isinstance(records[0].get("gold"), int) and "pred" in records[0]:
                self.cache[key] = "acc", {r["doc_id"]: float(r["pred"] == r["gold"]) for r in records}
            else:
                self.cache[key] = None
        return self.cache[key]


def mcnemar(a: list[float], b: list[float]) -> tuple[int, int, float]:
    """(a right and b wrong, a wrong and b right, exact two-sided McNemar p): the binomial test of
    the discordant pairs, exact at any count (the chi-square form is not, below a few dozen)."""
    only_a = sum(x > 0.5 >= y for x, y in zip(a, b))
    only_b = sum(y > 0.5 >= x for x, y in zip(a, b))
    n = only_a + only_b
    return only_a, only_b, (binomtest(only_a, n, 0.5).pvalue if n else 1.0)


def paired(first: dict, second: dict) -> tuple[list[float], list[float]]:
    docs = sorted(set(first) & set(second))
    return [first[d] for d in docs], [second[d] for d in docs]


def flips(results: pd.DataFrame, predictions: Predictions) -> pd.DataFrame:
    """Per pruned run and task, against the dense run of the same model and task."""
    named = labels(results)
    dense = results[results.pruner == "none"]
    rows = []
    for _, r in results[results.pruner != "none"].iterrows():
        base = dense[(dense.model == r.model) & (dense.protocol == r.protocol) & (dense.task == r.task)]
        if base.empty:
            continue
        pruned = predictions.correct(r.run_id, r.task, r.metric)
        reference = predictions.correct(base.run_id.iloc[0], r.task, r.metric)
        if pruned is None or reference is None:
            continue
        ref, new = paired(reference[1], pruned[1])
        lost, gained, p = mcnemar(ref, new)
        rows.append({"model": r.model, "pruner": named[r.pruner, r.config], "ratio": r.ratio, "seed": r.seed,
                     "task": r.task, "metric": pruned[0], "docs": len(ref), "dense": sum(ref) / len(ref),
                     "pruned": sum(new) / len(new), "right->wrong": lost, "wrong->right": gained, "p": p})
    table = pd.DataFrame(rows, columns=["model", "pruner", "ratio", "seed", "task", "metric", "docs", "dense",
                                        "pruned", "right->wrong", "wrong->right", "p"])
    return table.sort_values(["model", "pruner", "ratio", "task", "seed"]).reset_index(drop=True)


def comparisons(results: pd.DataFrame, predictions: Predictions) -> pd.DataFrame:
    """Every two rows at the same model, ratio and task: the same test on their paired documents
    (a row with several seeds pairs its seeds in order with the other row's, each document once per seed)."""
    named = labels(results)
    rows = []
    pruned = results[results.pruner != "none"]
    for (model, protocol, ratio, task), group in pruned.groupby(["model", "protocol", "ratio", "task"]):
        configs = sorted(dict.fromkeys(zip(group.pruner, group.config)), key=lambda c: named[c])
        for first, second in itertools.combinations(configs, 2):
            docs = {}
            for side, (pruner, config) in (("a", first), ("b", second)):
                runs = group[(group.pruner == pruner) & (group.config == config)].sort_values("seed")
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
            rows.append({"model": model, "ratio": ratio, "task": task, "metric": docs["a"][0][0],
                         "a": named[first], "b": named[second], "pairs": len(a), "a correct": sum(a) / len(a),
                         "b correct": sum(b) / len(b), "only a right": only_a, "only b right": only_b, "p": p})
    table = pd.DataFrame(rows, columns=["model", "ratio", "task", "metric", "a", "b", "pairs", "a correct",
                                        "b correct", "only a right", "only b right", "p"])
    return table.sort_values(["model", "ratio", "task", "a", "b"]).reset_index(drop=True)


def chance(results: pd.DataFrame, predictions: Predictions) -> dict[str, float]:
    """Each task's chance level: the mean of 1 / choices over its documents (multiple choice)."""
    out = {}
    for task, group in results[results.pruner == "none"].groupby("task"):
        records = read_predictions(group.run_id.iloc[0], task)
        if records and "loglikelihoods" in records[0]:
            out[task] = sum(1 / len(r["loglikelihoods"]) for r in records) / len(records)
    return out


def figure(table: pd.DataFrame, levels: dict[str, float]):
    """Each task's metric against the ratio, one line per row config, with standard-error bars (the
    run's own standard error, or the seeds' std / sqrt(seeds)), the dense level and chance."""
    columns = task_columns(table)
    fig, axes = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.6), squeeze=False)
    dense = table[table.pruner == "none"]
    for ax, column in zip(axes[0], columns):
        task = column.split("/")[0]
        for label, rows in table[table.pruner != "none"].groupby("label", sort=False):
            rows = rows.dropna(subset=[column]).sort_values("ratio")
            ax.errorbar(rows.ratio, rows[column], yerr=rows[f"{task}/stderr"], marker="o", capsize=3, label=label)
        for value in dense[column].dropna():
            ax.axhline(value, color="black", lw=1, ls="--", label="dense")
        if task in levels:
            ax.axhline(levels[task], color="grey", lw=1, ls=":", label="chance")
        ax.set(title=column, xlabel="ratio", ylabel=column.split("/")[-1])
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(names, handles))
    axes[0][0].legend(unique.values(), unique.keys(), fontsize=8)
    fig.tight_layout()
    return fig


def write_paper(runs: pd.DataFrame, out: Path) -> list[str]:
    """paper.{md,csv,tex}, flips.{md,csv}, comparisons.{md,csv}, paper.png; returns the Markdown sections."""
    results = task_results(runs)
    table = paper_table(results)
    shown = printed(table)
    predictions = Predictions()
    flipped, compared = flips(results, predictions), comparisons(results, predictions)
    table.to_csv(out / "paper.csv", index=False)
    (out / "paper.tex").write_text(to_latex(shown))
    flipped.to_csv(out / "flips.csv", index=False)
    compared.to_csv(out / "comparisons.csv", index=False)
    sections = [f"## Paper layout\n\n{to_markdown(shown)}"]
    if not flipped.empty:
        shown_flips = flipped.drop(columns="seed") if flipped.seed.nunique() == 1 else flipped
        sections.append(f"## Flips against the dense run (exact McNemar p)\n\n{to_markdown(shown_flips)}")
    if not compared.empty:
        sections.append("## Row against row at the same ratio (exact McNemar p)\n\n" + to_markdown(compared))
    (out / "paper.md").write_text("\n\n".join(sections) + "\n")
    fig = figure(table, chance(results, predictions))
    fig.savefig(out / "paper.png", dpi=110)
    plt.close(fig)
    return sections
