"""A model config's checks, before the model loads: where it is placed, its dtype, a local
checkpoint folder's files, and what its config says without loading it (its positions)."""

from __future__ import annotations

import importlib.util
import inspect

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.models.checkpoint_folder import check_checkpoint_folder
from prunebench.models.loaded import DTYPES
from prunebench.models.pretrained import POSITION_KEYS, checkpoint_config, position_limit

# accelerate's named placements (a {module: device} mapping is accepted as it is)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_model(model_cfg: DictConfig) -> None:
    check_device_map(model_cfg)
    check_dtype(model_cfg)


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


def check_dtype(model_cfg: DictConfig) -> None:
    """A loader resolves model.dtype only once it runs (models/loaded.py), after the store has a run."""
    if "dtype" not in model_cfg:
        return
    dtype = model_cfg.dtype
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not a dtype the models load in; use one of "
                          f"{['auto', *sorted(DTYPES)]} (auto: bf16 where the hardware computes it natively)")


def check_model_folder(model_cfg: DictConfig) -> None:
    """A local checkpoint folder's weights and tokenizer (models/checkpoint_folder.py); a hub id's
    files are not looked at here."""
    if "path" not in model_cfg or "revision" not in model_cfg or OmegaConf.is_missing(model_cfg, "path"):
        return
    try:
        check_checkpoint_folder(str(model_cfg.path), bool(model_cfg.get("trust_remote_code")))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def stated_config(model_cfg: DictConfig, deferred: list[str] | None = None):
    """The model's (language) config without loading it: a tiny model's own, as a dict; a checkpoint's
    config.json, which `checkpoint_config` reads, refusing a missing or empty model.path on the way.
    None: not known here. `deferred` (a plan's): the hub is not asked, and a hub id whose config.json
    is not in the local cache is named there, its checks left to the job's start."""
    config = model_cfg.get("text_config") or model_cfg.get("config")
    if "path" in model_cfg and "revision" in model_cfg:  # the from_pretrained loaders (hf_causal, hf_vlm, hf_classifier)
        if OmegaConf.is_missing(model_cfg, "path"):
            raise ConfigError(f"model={model_cfg.get('_target_', '').rsplit('.', 1)[-1]} needs model.path=<hub id "
                              f"(org/name) or a local checkpoint folder holding config.json>")
        try:
            config = checkpoint_config(str(model_cfg.path), model_cfg.revision, bool(model_cfg.get("trust_remote_code")),
                                       local_only=deferred is not None)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if config is None:
            deferred.append(f"model.path={model_cfg.path}: config.json not in the local Hugging Face cache, "
                            f"its checks run when the job starts")
    if config is None and model_cfg.get("_target_"):  # a preset's loader may state its architecture (gemma_gguf)
        config = getattr(get_method(model_cfg._target_), "stated_config", None)
    return OmegaConf.to_container(config) if OmegaConf.is_config(config) else config


def model_context(model_cfg: DictConfig, config=None) -> int | None:
    """The positions the model will read, where its config says so without loading it: model.max_length,
    else the position limit of its config (`config`, the model's `stated_config`, read here when not
    given). None: not known here."""
    config = stated_config(model_cfg) if config is None else config
    if model_cfg.get("max_length"):
        return int(model_cfg.max_length)
    return position_limit(config)


def check_generation_budget(tasks: dict, model_cfg: DictConfig, context: int | None) -> None:
    """A generation task's max_gen_toks must leave room for a prompt in the model's positions (the
    engine refuses it too, once the model has loaded)."""
    if context is None:
        return
    for name, task in tasks.items():
        budget = getattr(task, "max_gen_toks", None)
        if budget is not None and budget >= context:
            raise ConfigError(f"task {name}: max_gen_toks={budget} leaves no room for a prompt in model="
                              f"{model_cfg.name!r}'s {context} positions (model.max_length, else its config's "
                              f"{' / '.join(POSITION_KEYS)}); lower task.tasks.<task>.max_gen_toks below {context}")
