"""One row per model x pruner x sparsity (x task suite), read back from MLflow."""

from __future__ import annotations

import functools
import json

import mlflow
import pandas as pd

from prunebench.api.metrics import readable
from prunebench.report.settings import settings
from prunebench.tracking.run_key import RUNTIME_PATHS
from prunebench.tracking.store import KEY_TAG, WITHHELD_TAG
from prunebench.tracking.sweep import cell_run_ids

ID_COLUMNS = ["model", "pruner", "sparsity", "task"]
# what a table may hold together (report/settings.py): one table, one row of panels per value
SETTING = "setting"
# the setting that tells apart rows sharing the identity columns (`differences`)
DIFFERS = "differs"
# the data a run read besides its tasks' (the setting's): its calibration and recovery files in words
# (job.py), else (a run logged before) the digest of all its inputs
DATA_TAGS = ("tags.prunebench.calib_data", "tags.prunebench.recovery_data")
INPUTS_TAG = "tags.prunebench.inputs"
# a recovered run's recipe; runs that new name their data files in words (the digest of all inputs is not needed)
RECOVERY_TAG = "tags.prunebench.recovery"
# floats in CSVs: 12 significant digits hold every measurement and drop float64's rounding residue
# (a standard error of 0.20000000000000004 is written 0.2)
CSV_FLOATS = "%.12g"
# columns of the CSV that the Markdown leaves to the heading or the plots
DETAIL_SUFFIXES = ("_stderr", "/n_docs", "_ci_low", "_ci_high")
# recovery params a recipe's label leaves out: its seed (calibration's spread is shown apart) and those
# that change none of its numbers (the run key's contract)
RECOVERY_RUNTIME = ("recovery.seed", *(p for p in RUNTIME_PATHS if p.startswith("recovery.")))
# what the recovery column and label account for: its params and its data file
RECOVERY_PREFIXES = ("recovery.", "recovery_data")
UNRECOVERED = "{}"
# run ids per search of the earlier runs a sweep reused
BATCH = 100
TRAILING = ["avg/score", "stability/avg", "sparsity/actual", "latency/median_s", "latency/speedup"]
# the uncertainty of the trailing numbers, for the CSV and the plots
INTERVALS = ["avg/score_stderr", "stability/avg_ci_low", "stability/avg_ci_high"]


def load_runs(experiment: str, sweep_run_id: str | None = None) -> pd.DataFrame:
    """FINISHED job runs (the newest per run key), optionally only one sweep's grid: the parent's
    children and the earlier runs its skipped jobs and dense baselines reused (tracking/sweep.py)."""
    filters = ["attributes.status = 'FINISHED'", "tags.`prunebench.run_key` != ''"]
    search = functools.partial(mlflow.search_runs, experiment_names=[experiment], order_by=["attributes.start_time DESC"])
    if not sweep_run_id:
        frames = [search(filter_string=" and ".join(filters))]
    else:
        frames = [search(filter_string=" and ".join([*filters, f"tags.`mlflow.parentRunId` = '{sweep_run_id}'"]))]
        reused = cell_run_ids(mlflow.MlflowClient().get_run(sweep_run_id))
        for start in range(0, len(reused), BATCH):  # a filter's IN list is kept short
            ids = ", ".join(f"'{run_id}'" for run_id in reused[start:start + BATCH])
            frames.append(search(filter_string=" and ".join([*filters, f"attributes.run_id IN ({ids})"])))
    frames = [frame for frame in frames if not frame.empty]
    if not frames:
        return pd.DataFrame()
    runs = pd.concat(frames, ignore_index=True)
    runs = runs.sort_values("start_time", ascending=False)
    return runs.drop_duplicates("tags.prunebench.run_key").reset_index(drop=True)


def failed_jobs(experiment: str, sweep_run_id: str | None, finished: pd.DataFrame) -> pd.DataFrame:
    """The jobs that ended FAILED or KILLED, each with the first line of its error (tag
    prunebench.error), a sweep's or the whole experiment's, less those whose run key has a FINISHED
    run in `finished`: a later attempt (a requeued job's, a rerun's) mended them. A job refused by
    validation has no key and stays."""
    filters = ["attributes.status != 'FINISHED'", "attributes.status != 'RUNNING'"]  # no IN for status
    if sweep_run_id:
        filters.append(f"tags.`mlflow.parentRunId` = '{sweep_run_id}'")
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=" and ".join(filters),
                              order_by=["attributes.start_time ASC"])
    columns = ["job", "status", "overrides", "error", "run_id"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    def tag(name: str) -> pd.Series:
        return runs.get(f"tags.{name}", pd.Series([None] * len(runs))).fillna("")
    keep = tag("prunebench.sweep") != "true"
    if not finished.empty:
        keep &= ~tag(KEY_TAG).isin(set(finished[f"tags.{KEY_TAG}"]))
    errors = tag("prunebench.error").map(lambda e: e.strip().splitlines()[0] if e.strip() else "(no error recorded)")
    table = pd.DataFrame({"job": tag("mlflow.runName"), "status": runs.status, "overrides": tag("hydra.overrides"),
                          "error": errors, "run_id": runs.run_id})
    return table[keep.values].reset_index(drop=True)


def results_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Columns: the setting, the identity, each task's primary metric (as the run's avg tag names it),
    then the average, stability, achieved sparsity and latency when logged; and for the CSV and the
    plots each metric's standard error, each task's documents and the stability's interval."""
    rows, task_cols, details = [], [], []
    for (_, run), heading in zip(runs.iterrows(), settings(runs)):
        row = {SETTING: heading, "model": run["tags.prunebench.model"], "pruner": run["tags.prunebench.pruner"],
               "sparsity": float(run["tags.prunebench.sparsity"]), "task": run["tags.prunebench.task"]}
        primary = json.loads(run.get("tags.prunebench.avg_metrics") or "{}")
        for task, metric in primary.items():
            col = f"{task}/{metric}"
            row[col] = run.get(f"metrics.{col}")
            if col not in task_cols:
                task_cols.append(col)
            for detail in (f"{col}_stderr", f"{task}/n_docs"):
                row[detail] = run.get(f"metrics.{detail}")
                details += [detail] if detail not in details else []
        for col in [*TRAILING, *INTERVALS]:
            row[col] = run.get(f"metrics.{col}")
        rows.append({**row, "run_id": run["run_id"]})
    table = pd.DataFrame(rows, columns=[SETTING, *ID_COLUMNS, *task_cols, *TRAILING, *details, *INTERVALS, "run_id"])
    for col in table.columns[len(ID_COLUMNS) + 1:-1]:
        table[col] = table[col].map(readable)
    recovered = RECOVERY_TAG in runs.columns
    # a recovery is the recovery column, not a difference
    differs = differences(runs, ignore=RECOVERY_PREFIXES if recovered else ())
    if differs.any():  # rows of one setting, model, pruner, sparsity and task that ran other settings or data
        table.insert(len(ID_COLUMNS) + 1, DIFFERS, differs.tolist())
    if recovered:  # a pruning w/ tune beside the same w/o: the recipe ('' none), its own line in the plots
        configs = [json.dumps(recovery_config(run)) for _, run in runs.iterrows()]
        named = recipe_labels(configs)
        table.insert(len(ID_COLUMNS) + 1, "recovery", [named[c] for c in configs])
    table = table.dropna(axis=1, how="all")
    return table.sort_values([SETTING, "model", "task", "pruner", "sparsity", *(["recovery"] if recovered else [])],
                             key=dense_first).reset_index(drop=True)


def recovery_config(run: pd.Series) -> dict[str, str]:
    """The recovery fine-tune a run had (`recovery.*` params; with its data file's name and digest,
    which its run key holds), {} for none: a recovery=none run logs no recovery params."""
    if not isinstance(run.get(RECOVERY_TAG), str):
        return {}
    params = {c[len("params."):]: v for c, v in run.items() if c.startswith("params.recovery.") and isinstance(v, str)}
    data = run.get("tags.prunebench.recovery_data")
    return {k: v for k, v in sorted({**params, **({"recovery_data": data} if isinstance(data, str) else {})}.items())
            if k not in RECOVERY_RUNTIME}


def recipe_labels(configs) -> dict[str, str]:
    """{recovery config (JSON of `recovery_config`): its recipe's name, with the parameters that tell
    two configs of one recipe apart (`lora, lr=0.001`)}; '' for none."""
    parsed = {c: json.loads(c) for c in configs if c != UNRECOVERED}
    out = {UNRECOVERED: ""}
    for name in {c["recovery.name"] for c in parsed.values()}:
        same = {k: c for k, c in parsed.items() if c["recovery.name"] == name}
        varying = sorted({k for c in same.values() for k in c if len({d.get(k) for d in same.values()}) > 1})
        for key, config in same.items():
            out[key] = ", ".join([name, *(f"{k.removeprefix('recovery.')}={config.get(k)}" for k in varying)])
    return out


def task_columns(table: pd.DataFrame) -> list[str]:
    """The tasks' primary-metric columns of a `results_table`."""
    return [c for c in table.columns if "/" in c and c not in TRAILING and not c.startswith("stability/")
            and not c.endswith(DETAIL_SUFFIXES)]


def shown_columns(table: pd.DataFrame) -> list[str]:
    """What the Markdown prints: the setting is the heading, the details are in the CSV."""
    return [c for c in table.columns if c not in (SETTING, "run_id") and not c.endswith(DETAIL_SUFFIXES)
            and not (c == DIFFERS and (table[c] == "").all()) and table[c].notna().any()]


def differences(runs: pd.DataFrame, shown: int = 40, ignore: tuple[str, ...] = ()) -> pd.Series:
    """Per run, `key=value` of each setting (a logged param, or the calibration or recovery data read) that
    differs between runs sharing a setting (report/settings.py), model, pruner, sparsity and task (a
    template, a pruner's parameter), in the words of the override that sets it; empty strings when
    no two runs share them. `ignore`: prefixes of params a caller accounts for otherwise (the seeds it
    averages, the pruner's config it labels rows with)."""
    runtime = tuple(f"params.{path}" for path in RUNTIME_PATHS if "*" not in path)
    data = [tag for tag in DATA_TAGS if tag in runs.columns]
    if not data and INPUTS_TAG in runs.columns and RECOVERY_TAG not in runs.columns:
        data = [INPUTS_TAG]
    def label(column: str) -> str:
        return column.removeprefix("tags.prunebench.") if column in data else column.removeprefix("params.")
    columns = [c for c in runs.columns if ((c.startswith("params.") and not c.startswith(runtime)) or c in data)
               and not label(c).startswith(ignore)]
    ids = [f"tags.prunebench.{c}" for c in ID_COLUMNS]
    keyed = runs.assign(**{SETTING: settings(runs)})
    def value(v) -> str:  # a path's end names the file: cut from the front; a newline kept visible
        text = str(v).replace("\n", "\\n")
        return text if len(text) <= shown else "..." + text[-(shown - 3):]
    out = pd.Series([""] * len(runs), index=runs.index, dtype=str)
    for _, group in keyed.groupby([SETTING, *ids], dropna=False):
        varying = [c for c in columns if group[c].astype(str).nunique() > 1]
        for index, run in group.iterrows():
            out[index] = ", ".join(f"{label(c)}={value(run[c])}" for c in varying)
    return out.reset_index(drop=True)


def documents(counts: dict[str, list[float]]) -> str:
    """`documents: arc_easy 100, piqa 76`: how many documents each task's numbers rest on (a range
    where runs differ); '' when no run logged it (runs older than `<task>/n_docs`)."""
    shown = []
    for task, values in counts.items():
        known = sorted({int(v) for v in values if pd.notna(v)})
        if known:
            shown.append(f"{task} {known[0]}" + (f"-{known[-1]}" if len(known) > 1 else ""))
    return "documents: " + ", ".join(shown) if shown else ""


def withheld_note(runs: pd.DataFrame) -> str:
    """Why a task has no number in a table although its run finished: one line per run and task
    whose job withheld the score (a judge that failed too often; headline.withheld_tasks), '' when none."""
    lines = []
    for _, run in runs.iterrows():
        tag = run.get(f"tags.{WITHHELD_TAG}")
        for task, reason in (json.loads(tag) if isinstance(tag, str) and tag else {}).items():
            where = " | ".join(str(run[f"tags.prunebench.{key}"]) for key in ("model", "pruner", "sparsity"))
            lines.append(f"- {task}, {where} (run {run['run_id']}): {reason}")
    return "No headline number (left out of the tables, avg/score and stability):\n\n" + "\n".join(lines) if lines else ""


def dense_first(col: pd.Series) -> pd.Series:
    return col.map(lambda v: "" if v == "none" else v) if col.name == "pruner" else col


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub-style table without the `tabulate` dependency pandas would need."""
    def fmt(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.4g}"
        return str(v).replace("|", "\\|")  # a template's `|` would end the cell
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])
