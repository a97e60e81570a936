"""Suite averages across runs. HIES prunes a different fine-tuned checkpoint per GLUE task, so each
job evaluates one task and no run holds the GLUE average; here the single-task runs of a suite's
member tasks are pooled per pruner and sparsity, and their primary metrics averaged as the suite's
`avg/score` averages them when one run evaluates every task."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from prunebench.api.task_keys import task_names
from prunebench.paths import CONF_DIR
from prunebench.report.settings import DEFAULTS, heading, setting
from prunebench.report.table import SETTING, dense_first

POOLED = "(one per task)"
# what the runs pooled into one suite row must share besides the model: their task differs by design,
# and so does the data file each task reads (report/settings.py); templated and raw runs never pool
SHARED = ("limit", "dtype", "numerics", "protocol", "chat")


def suite_members(conf_dir: str = CONF_DIR) -> dict[str, list[str]]:
    """{suite: its task names} for every `task` option evaluating more than one task, composed by
    Hydra as a job composes it, whether the suite lists task options or task definitions. Inside a
    running Hydra app (a sweep's end) the app's config is used; else `conf_dir`'s, composed once per
    process while none of its files changes (composing is the slow part of a report)."""
    if GlobalHydra.instance().is_initialized():
        return composed_suites(conf_dir)
    files = [path.stat() for path in Path(conf_dir).rglob("*.yaml")]
    state = (len(files), max((f.st_mtime_ns for f in files), default=0), sum(f.st_size for f in files))
    return {suite: list(tasks) for suite, tasks in suites_of(str(conf_dir), state).items()}


@functools.lru_cache(maxsize=4)
def suites_of(conf_dir: str, state: tuple[int, int, int]) -> dict[str, tuple[str, ...]]:
    """`suite_members` of `conf_dir` whose YAML files' count, latest change and total size are `state`."""
    with initialize_config_dir(conf_dir, version_base="1.3"):
        return {suite: tuple(tasks) for suite, tasks in composed_suites(conf_dir).items()}


def composed_suites(conf_dir: str) -> dict[str, list[str]]:
    """Inside Hydra's initialization. An option whose defaults list names fewer than two configs
    cannot be a suite and is not composed."""
    candidates = [path.stem for path in sorted((Path(conf_dir) / "task").glob("*.yaml"))
                  if sum(entry != "_self_" for entry in OmegaConf.load(path).get("defaults") or []) > 1]
    options = [compose(f"task/{name}").task for name in candidates]
    return {str(option.name): task_names(option) for option in options if len(task_names(option)) > 1}


def single_task_results(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run that evaluated exactly one task: its identity (with whose prompts and scoring
    ran), the task, the task's primary metric (as the run's avg tag names it), that metric's value and
    the task's stability."""
    rows = []
    for _, run in runs.iterrows():
        primary = json.loads(run.get("tags.prunebench.avg_metrics") or "{}")
        if len(primary) != 1:
            continue
        (task, metric), = primary.items()
        values = setting(run)
        rows.append({"model": run["tags.prunebench.model"], **{key: values[key] for key in SHARED},
                     "pruner": run["tags.prunebench.pruner"],
                     "sparsity": float(run["tags.prunebench.sparsity"]), "task": task, "column": f"{task}/{metric}",
                     "value": run.get(f"metrics.{task}/{metric}"), "stability": run.get(f"metrics.stability/{task}")})
    return pd.DataFrame(rows, columns=["model", *SHARED, "pruner", "sparsity", "task", "column", "value",
                                       "stability"])


def suite_tables(runs: pd.DataFrame, only: list[str] | None = None, members: dict[str, list[str]] | None = None
                 ) -> dict[str, pd.DataFrame]:
    """{suite: `suite_table`}. By default a suite gets a table when single-task runs of at least two
    of its tasks exist (one task's runs would repeat the results table); `only` asks for given
    suites, each needing at least one. `members`: the task options' suites by default."""
    results = single_task_results(runs)
    if not only and results.task.nunique() < 2:
        return {}
    members = suite_members() if members is None else members
    unknown = sorted(set(only or ()) - set(members))
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; suites (task options listing several tasks): "
                         f"{sorted(members)}")
    tables = {}
    for suite in only or members:
        rows = results[results.task.isin(members[suite])]
        if rows.task.nunique() >= (1 if only else 2):
            tables[suite] = suite_table(rows, members[suite])
        elif only:
            raise LookupError(f"suite {suite}: no FINISHED single-task run of its tasks {members[suite]}")
    return tables


def suite_table(rows: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """One row per model x pruner x sparsity. A model that ran several of the suite's tasks gets rows
    of its own; models that ran one task each (a fine-tuned checkpoint per task) share rows, model
    `(one per task)`; runs under another protocol (OpenCompass's) never share a row with lm-eval's
    (column `protocol` unless all are lm-eval's), nor do runs of another limit, dtype or numerics: each
    row's `setting` names them, as a results table's does. A task's cell is its runs' mean (`runs` counts
    them); `avg/score` averages the tasks present, `partial` says some are missing, `missing` which;
    `stability/avg` averages the stabilities the tasks have (each run against its own dense run; a
    task whose dense value is near zero has none), as a job's own does."""
    tasks_per_model = rows.groupby("model").task.nunique()
    rows = rows.assign(model=rows.model.map(lambda m: m if tasks_per_model[m] > 1 else POOLED))
    columns = [c for t in tasks for c in dict.fromkeys(rows.column[rows.task == t])]
    table = []
    for (model, *shared, pruner, sparsity), group in rows.groupby(["model", *SHARED, "pruner", "sparsity"]):
        values = group.groupby("column").value.mean()
        present = [t for t in tasks if t in set(group.task)]
        table.append({SETTING: heading({"model": model, **dict(zip(SHARED, shared))}), "model": model,
                      "protocol": shared[SHARED.index("protocol")], "pruner": pruner, "sparsity": sparsity,
                      **values.to_dict(),
                      "avg/score": values.mean(),
                      "stability/avg": group.groupby("task").stability.mean().mean(),
                      "tasks": f"{len(present)}/{len(tasks)}", "partial": len(present) < len(tasks),
                      "missing": " ".join(t for t in tasks if t not in present), "runs": len(group)})
    table = pd.DataFrame(table, columns=[SETTING, "model", "protocol", "pruner", "sparsity", *columns, "avg/score",
                                         "stability/avg", "tasks", "partial", "missing", "runs"])
    table = table.sort_values([SETTING, "pruner", "sparsity"], key=dense_first).reset_index(drop=True)
    if set(rows.protocol) == {DEFAULTS["protocol"]}:
        table = table.drop(columns="protocol")
    return table.dropna(axis=1, how="all")
