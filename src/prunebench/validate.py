"""Everything that can be wrong with a composed config is found here, before any model loads."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A bad config value; the message names the value and what would be valid."""


# The protocol a task definition under task.tasks follows: lm-evaluation-harness's prompts and scoring.
NATIVE_PROTOCOL = "lm_eval"


def task_definitions(cfg: DictConfig) -> dict[str, tuple[str, dict]]:
    """Each task's definition under `task.protocol`, resolved, with the config path it came from.

    `task.tasks.<name>` is lm-eval's version; another protocol's lives beside it under
    `task.protocols.<protocol>.<name>` (conf/tasks/opencompass/), put there by the task's own config.
    The choice is made here because Hydra's defaults list cannot select a config by a value such as
    task.protocol, and keeping the versions apart leaves `task.tasks.<name>` a plain task definition
    that calib=task can reuse. A definition with its own `protocol` option builds every protocol's
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
    return definitions


# accelerate's named placements (a {module: device} mapping is accepted as it is)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(model_cfg: DictConfig) -> None:
    device_map = model_cfg.get("device_map")
    if device_map is None:
        return
    if not isinstance(device_map, DictConfig) and device_map not in DEVICE_MAPS:
        raise ConfigError(f"model.device_map={device_map!r}: use one of {list(DEVICE_MAPS)}, a mapping "
                          f"{{module: device}}, or null (the whole model on model.device)")
    loader = get_method(model_cfg._target_)
    if "device_map" not in inspect.signature(loader).parameters:
        raise ConfigError(f"model={model_cfg.name!r} is not loaded through Hugging Face's from_pretrained "
                          f"({model_cfg._target_}), so model.device_map cannot place it; use model.device")
    if importlib.util.find_spec("accelerate") is None:
        raise ConfigError("model.device_map needs the accelerate package (pip install accelerate)")


def validate(cfg: DictConfig) -> dict:
    """Checks the config and returns the instantiated tasks (their data sources checked)."""
    ratio = cfg.sparsity
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) < 1.0:
        raise ConfigError(f"sparsity={ratio!r} is outside [0, 1); use a fraction of the pruner's unit "
                          f"removed, such as sparsity=0.5 (0 = the dense baseline)")
    limit = cfg.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} must be a positive integer (documents per task) or null")
    data_dir = cfg.get("data_dir")
    if data_dir is not None and not Path(str(data_dir)).expanduser().is_dir():
        raise ConfigError(f"data_dir={data_dir!r} is not a folder; it holds benchmark files in the README's "
                          f"layout (arc/ARC-Easy-Test.jsonl, piqa/valid.jsonl, ...), or null reads the hub")
    try:
        pruner_cls = get_class(cfg.pruner._target_)
    except Exception as err:
        raise ConfigError(f"pruner._target_={cfg.pruner._target_!r} cannot be imported: {err}") from err
    if cfg.model.family not in pruner_cls.families:
        raise ConfigError(f"pruner={cfg.pruner.name!r} cannot apply to model={cfg.model.name!r} "
                          f"(family {cfg.model.family!r}); it supports: {sorted(pruner_cls.families)}")
    check_device_map(cfg.model)
    try:
        pruner = instantiate(cfg.pruner, _convert_="all")
        if float(ratio) > 0:
            pruner.check(float(ratio))
    except Exception as err:
        raise ConfigError(f"pruner={cfg.pruner.name!r} is misconfigured: {err}") from err
    if not cfg.task.get("tasks"):
        raise ConfigError(f"task={cfg.task.get('name')!r} defines no tasks")
    tasks = {}
    for name, (where, definition) in task_definitions(cfg).items():
        label = f"task {name}" if where == f"task.tasks.{name}" else f"task {name} ({where})"
        try:
            task = instantiate(definition, _convert_="all")
            task.check()
        except FileNotFoundError as err:
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
        families = getattr(task, "families", None)
        if families and cfg.model.family not in families:
            raise ConfigError(f"task {name} cannot evaluate model={cfg.model.name!r} (family {cfg.model.family!r}); "
                              f"it evaluates: {sorted(families)}")
        tasks[name] = task
    if cfg.bench.name != "none":
        options = OmegaConf.to_container(cfg.bench, resolve=True)
        options.pop("semi_structured", None)
        try:
            bench = instantiate(options)
        except Exception as err:
            raise ConfigError(f"bench={cfg.bench.name!r} is misconfigured: {err}") from err
        if cfg.model.family not in bench.families:
            raise ConfigError(f"bench={cfg.bench.name!r} cannot time model={cfg.model.name!r} (family "
                              f"{cfg.model.family!r}); it times: {sorted(bench.families)}")
    if get_class(cfg.pruner._target_).needs_calibration:
        if cfg.calib.get("_target_") is None:
            raise ConfigError(f"pruner={cfg.pruner.name!r} needs calibration data, but calib={cfg.calib.name!r}; "
                              f"choose one, e.g. calib=wikitext2 or calib=file calib.path=FILE")
        try:
            calib = instantiate(cfg.calib, _convert_="all")
            calib.check()
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from err
        except Exception as err:
            raise ConfigError(f"calib={cfg.calib.name!r} is misconfigured: {err}") from err
        shared = calib.evaluated_overlap(tasks)
        if shared and not calib.allow_eval_split:
            raise ConfigError(f"calib={cfg.calib.name!r} reads data that is evaluated ({shared}); calibrate on "
                              f"another split or source, or set calib.allow_eval_split=true to do it anyway")
    return tasks
