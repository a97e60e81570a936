"""The task names a composed `task` option evaluates, read from the config alone (nothing built):
validation, the job's run name and the reports need them before, or without, any task object."""

from __future__ import annotations


def lm_eval_entries(entries) -> list:
    """A `task.lm_eval` value as a list of entries, each a mapping ({task, name, ...}) where it was
    given as a bare name; anything else is left for validation to refuse."""
    entries = [] if entries is None else [entries] if isinstance(entries, str) else entries
    return [{"task": e} if isinstance(e, str) else e for e in entries]


def lm_eval_names(entries) -> list[str]:
    """The task names a `task.lm_eval` list gives (an entry's `name`, else its `task`)."""
    return [str(e.get("name") or e.get("task")) for e in lm_eval_entries(entries)]


def joined_names(entries) -> str:
    """A task option's name from the lm-eval tasks it lists (`task=lm_eval task.lm_eval=[boolq,rte]`
    runs as "boolq+rte"): run names and tags then say what ran."""
    return "+".join(lm_eval_names(entries))


def task_names(task_cfg) -> list[str]:
    """Every task a composed `task` option evaluates: its definitions, then its lm-eval entries."""
    return [*(task_cfg.get("tasks") or {}), *lm_eval_names(task_cfg.get("lm_eval"))]
