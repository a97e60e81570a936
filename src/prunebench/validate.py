"""Everything that can be wrong with a composed config is found here, before any model loads."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.evaluation.loglikelihood import check_numerics
from prunebench.tasks.build import build_tasks


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
    """Checks the config and returns the tasks built from it (tasks/build.py, their data sources checked)."""
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
    try:
        check_numerics(cfg.get("eval") or {})
    except ValueError as err:
        raise ConfigError(str(err)) from err
    tasks = build_tasks(cfg)
    for name, task in tasks.items():
        families = getattr(task, "families", None)
        if families and cfg.model.family not in families:
            raise ConfigError(f"task {name} cannot evaluate model={cfg.model.name!r} (family {cfg.model.family!r}); "
                              f"it evaluates: {sorted(families)}")
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
