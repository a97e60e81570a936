"""Tasks built from a composed config: each task's version under `task.protocol` chosen and
instantiated, its data source checked. validate.py calls this before any model loads."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.api.requests import IMAGE_FAMILIES, KIND_FAMILIES
from prunebench.api.task_keys import lm_eval_entries

# The protocol a task definition under task.tasks follows: lm-evaluation-harness's prompts and scoring.
NATIVE_PROTOCOL = "lm_eval"
LM_EVAL_TASK = "prunebench.tasks.lm_eval_task.LmEvalTask"
LM_EVAL_ENTRY_KEYS = {"task", "name", "num_fewshot", "primary", "fewshot_split"}


def lm_eval_definitions(cfg: DictConfig) -> dict[str, tuple[str, dict]]:
    """`task.lm_eval`'s entries (lm-eval names, or {task, name, num_fewshot, primary, fewshot_split}) as task
    definitions, with the options the task config shares (conf/task_base/lm_eval.yaml) and data_dir."""
    entries = lm_eval_entries(OmegaConf.to_container(cfg.task.lm_eval, resolve=True)
                              if OmegaConf.is_config(cfg.task.get("lm_eval")) else cfg.task.get("lm_eval"))
    if not entries:
        return {}
    shared = {key: OmegaConf.to_container(cfg.task[key], resolve=True) if OmegaConf.is_config(cfg.task[key])
              else cfg.task[key] for key in ("num_fewshot", "include_path", "data_files", "bootstrap_iters")
              if key in cfg.task}
    definitions = {}
    for i, entry in enumerate(entries):
        where = f"task.lm_eval[{i}]"
        unknown = sorted(set(entry) - LM_EVAL_ENTRY_KEYS) if isinstance(entry, dict) else None
        if unknown is None or "task" not in entry or unknown:
            raise ConfigError(f"{where}={entry!r}: an lm-eval task name or a mapping with 'task' and any of "
                              f"{sorted(LM_EVAL_ENTRY_KEYS - {'task'})}" + (f" (unknown: {unknown})" if unknown else ""))
        name = entry.get("name") or entry["task"]
        if name in definitions or name in (cfg.task.get("tasks") or {}):
            raise ConfigError(f"{where}: task {name!r} is listed twice; give one a name of its own ({{task: {entry['task']}, name: ...}})")
        definitions[name] = where, {"_target_": LM_EVAL_TASK, **shared, **entry, "name": name,
                                    "data_dir": cfg.get("data_dir")}
    return definitions


def task_definitions(cfg: DictConfig) -> dict[str, tuple[str, dict]]:
    """Each task's definition under `task.protocol`, resolved, with the config path it came from.

    `task.tasks.<name>` is lm-eval's version; another protocol's lives beside it under
    `task.protocols.<protocol>.<name>`, put there by the task's own config (conf/task/<name>.yaml).
    The choice is made here because Hydra's defaults list cannot select a config by a value such as
    task.protocol, and keeping the versions apart leaves `task.tasks.<name>` a plain task definition
    that `task@calib.task=NAME` can reuse. A definition with its own `protocol` option builds every protocol's
    version itself (BBH) and is used as it is."""
    protocol = cfg.task.get("protocol") or NATIVE_PROTOCOL
    offered = cfg.task.get("protocols") or {}
    definitions = {}
    for name, native in cfg.task.tasks.items():
        if name in (offered.get(protocol) or {}):
            where = f"task.protocols.{protocol}.{name}"
        elif protocol == NATIVE_PROTOCOL or "protocol" in native:
            where = f"task.tasks.{name}"
        else:
            valid = [NATIVE_PROTOCOL, *(p for p, tasks in offered.items() if name in (tasks or {}))]
            raise ConfigError(f"task.protocol={protocol!r}: task {name} has no {protocol} version; "
                              f"its protocols: {valid}")
        try:
            definitions[name] = where, OmegaConf.to_container(OmegaConf.select(cfg, where), resolve=True)
        except Exception as err:
            raise ConfigError(f"{where} is misconfigured: {err}") from err
    lm_eval = lm_eval_definitions(cfg)
    shots = cfg.task.get("num_fewshot")
    for where, definition in [("task", {"num_fewshot": shots}), *definitions.values(), *lm_eval.values()]:
        check_num_fewshot(where, definition.get("num_fewshot"))
    if lm_eval and protocol != NATIVE_PROTOCOL:
        raise ConfigError(f"task.protocol={protocol!r}: lm-eval tasks {sorted(lm_eval)} have only lm-eval's version")
    return {**definitions, **lm_eval}


def check_num_fewshot(where: str, shots) -> None:
    """lm-eval reads a negative count as zero shots (and random.sample refuses it elsewhere): a typo
    for 0 or 1 would run silently at another protocol than the one asked for."""
    if shots is not None and (isinstance(shots, bool) or not isinstance(shots, int) or shots < 0):
        raise ConfigError(f"{where}.num_fewshot={shots!r} must be a whole number of examples, 0 or more (null: "
                          f"the task's own)")


def build_tasks(cfg: DictConfig) -> dict:
    """{name: task} of `cfg.task`, in its order; a bad definition or a missing file raises ConfigError
    naming the config path to fix."""
    tasks = {}
    for name, (where, definition) in task_definitions(cfg).items():
        label = f"task {name}" if where == f"task.tasks.{name}" else f"task {name} ({where})"
        if where.startswith("task.lm_eval"):
            label = f"lm-eval task {name} ({where})"
        try:
            task = instantiate(definition, _convert_="all")
            task.check()
        except FileNotFoundError as err:
            if where.startswith("task.lm_eval"):
                raise ConfigError(f"{label}: {err}") from err
            # sources name the task's config generically (task.tasks.<task>); here its path is known, and a
            # version whose source is interpolated reads the lm-eval task's documents, set there
            node = OmegaConf.select(cfg, where)
            owner = f"task.tasks.{name}" if "source" in node and OmegaConf.is_interpolation(node, "source") else where
            raise ConfigError(f"{label}: {str(err).replace('task.tasks.<task>', owner)}") from err
        except Exception as err:
            raise ConfigError(f"{label} is misconfigured: {err}") from err
        if task.name != name:
            raise ConfigError(f"task key {name!r} and its name {task.name!r} differ; metrics are logged "
                              f"under the name, so keep them equal")
        tasks[name] = task
    return tasks


def built(tasks: dict) -> dict:
    """The tasks that were built: a plan leaves a task whose data only the hub has unbuilt (hub.py)."""
    return {name: task for name, task in tasks.items() if not getattr(task, "deferred", False)}


def task_families(task) -> frozenset[str] | None:
    """The model families that can answer a task: its own `families`, else its request kind's; a
    task whose requests carry images needs a vision-language model. None: no constraint known."""
    if reads_images(task):
        return IMAGE_FAMILIES
    return getattr(task, "families", None) or KIND_FAMILIES.get(task.kind)


def reads_images(task) -> bool:
    return any(getattr(member, "doc_to_image", None) for member in getattr(task, "members", [task]))


def check_tasks(tasks: dict, model_cfg: DictConfig) -> None:
    """Each built task can evaluate the model's family, and each judge of a judged task answers one
    cheap request (`reach`), so a judge server that is down fails here rather than after the model
    has loaded and answered every question."""
    asked = set()
    for name, task in built(tasks).items():
        families = task_families(task)
        if families and model_cfg.family not in families:
            kind = f"{task.kind} requests" + (" with images" if reads_images(task) else "")
            raise ConfigError(f"task {name} ({kind}) cannot evaluate model={model_cfg.name!r} "
                              f"(family {model_cfg.family!r}); it evaluates: {sorted(families)}")
        for member in getattr(task, "members", [task]):
            judge = getattr(member, "judge", None)
            if judge is None or not hasattr(judge, "reach") or repr(judge) in asked:
                continue
            asked.add(repr(judge))
            try:
                judge.reach()
            except ValueError as err:
                raise ConfigError(f"task {member.name}'s judge ({judge.model}): {err}") from None
