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


# a task option's own keys; any other key beside them overrides its one definition (`chosen_definition`)
OPTION_KEYS = ("name", "tasks", "protocols")


def chosen_definition(option, where: str):
    """The one benchmark definition of a task option selected under another key (`task@calib.task=NAME`
    gives {name, tasks: {NAME: definition}, protocols}), with the keys set beside it merged over it: a
    preset's `task.source.split: train`, written before the benchmark is chosen. A mapping without
    `tasks` (overrides alone, or a definition written in place) is returned as it is. The merge is
    detached from the root config: attach it there before its interpolations (`data_dir`) resolve.
    Raises ValueError for an option holding other than one definition (a suite, `lm_eval`)."""
    from omegaconf import DictConfig, OmegaConf

    if option is None or "tasks" not in option:
        return option
    items = dict(option.items_ex(resolve=False) if isinstance(option, DictConfig) else option.items())
    tasks = items["tasks"] or {}
    if len(tasks) != 1:
        raise ValueError(f"{where}={items.get('name')!r} holds {len(tasks)} task definitions {list(tasks)}; "
                         f"{where} takes one benchmark's: task@{where}=NAME")
    rest = {key: value for key, value in items.items() if key not in OPTION_KEYS}
    return OmegaConf.merge(next(iter(tasks.values())), rest)
