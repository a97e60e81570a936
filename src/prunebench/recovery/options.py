"""A recovery's options (`conf/recovery/*.yaml`), checked before any model loads: its choices, its
counts, the model family it trains, a sequence length the model reads, and its data."""

from __future__ import annotations

import functools
import json
import logging
import re

from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.api.seeds import torch_seed
from prunebench.corpora import task_data_ids
from prunebench.hub import deferring
from prunebench.models.pretrained import POSITION_KEYS
from prunebench.recovery.checks import check_options
from prunebench.recovery.data import recovery_data

log = logging.getLogger(__name__)
# the families whose causal LM a recovery trains (an adapter on their Linear projections)
RECOVERY_FAMILIES = ("causal_lm", "moe")
CHOICES = {"objective": ("lm", "distill"), "parameters": ("lora", "full")}
COUNTS = ("seq_len", "batch_size", "micro_batch_size", "epochs", "val_samples", "val_every")
OPTIONAL_COUNTS = ("max_steps", "n_samples", "early_stopping_patience")
POSITIVE = ("lr", "temperature")


def positive_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def check_recovery(cfg: DictConfig, context: int | None, deferred: list[str] | None = None, config=None,
                   tasks: dict | None = None) -> None:
    """recovery=...: its options, the model family, a sequence length the model reads (`context`,
    None: not known), the LoRA targets against the model's modules (`config`, the model's stated
    config; None: not known), and its data (there, non-empty, the alpaca schema, one batch besides the
    held-out examples, not the evaluated `tasks`' documents). The caller checks only a job that
    recovers (a dense job trains nothing)."""
    rec = cfg.recovery
    if cfg.model.family not in RECOVERY_FAMILIES:
        raise ConfigError(f"recovery={rec.name} trains a causal language model, but model={cfg.model.name!r} is "
                          f"family {cfg.model.family!r}; recovery works for {list(RECOVERY_FAMILIES)}, else recovery=none")
    for key, valid in CHOICES.items():
        if rec[key] not in valid:
            raise ConfigError(f"recovery.{key}={rec[key]!r}; valid: {list(valid)}")
    for key in COUNTS:
        if not positive_int(rec[key]):
            raise ConfigError(f"recovery.{key}={rec[key]!r} must be a positive integer")
    for key in OPTIONAL_COUNTS:
        if rec[key] is not None and not positive_int(rec[key]):
            raise ConfigError(f"recovery.{key}={rec[key]!r} must be a positive integer or null")
    if rec.seq_len < 2:
        raise ConfigError(f"recovery.seq_len={rec.seq_len} must be at least 2 (one token to read, one to predict)")
    if rec.batch_size % rec.micro_batch_size:
        raise ConfigError(f"recovery.batch_size={rec.batch_size} is not a multiple of recovery.micro_batch_size="
                          f"{rec.micro_batch_size} (the micro-batches accumulated into one step)")
    for key in POSITIVE:
        if isinstance(rec[key], bool) or not isinstance(rec[key], (int, float)) or rec[key] <= 0:
            raise ConfigError(f"recovery.{key}={rec[key]!r} must be a positive number")
    if context is not None and rec.seq_len > context:
        raise ConfigError(f"recovery.seq_len={rec.seq_len} is beyond model={cfg.model.name!r}'s {context} positions "
                          f"(model.max_length, else its config's {' / '.join(POSITION_KEYS)}); set recovery.seq_len<={context}")
    try:
        torch_seed("recovery.seed", rec.seed)
        check_options(OmegaConf.to_container(rec, resolve=True))
        data = recovery_data(cfg, deferred)
        with deferring(deferred):
            data.check()
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    if rec.n_samples is not None and data.records_file():
        log.warning("recovery.n_samples=%s is read only for text (windows drawn from it); the instruction records of "
                    "recovery.data=%s are each one example, all of them used: n_samples has no effect here",
                    rec.n_samples, rec.data)
    shared = {name: ids for name, task in (tasks or {}).items() if (ids := data.data_ids() & task_data_ids(task))}
    if shared and not rec.get("allow_eval_split", False):
        raise ConfigError(f"recovery.data={rec.data} trains on data that is evaluated ({shared}): the recovered model "
                          f"would be scored on what it was trained on; train on another split or source, or set "
                          f"recovery.allow_eval_split=true to do it anyway")
    if rec.parameters == "lora" and config:
        check_targets(cfg.model.name, config, list(rec.lora.targets))


def check_targets(model: str, config, targets: list[str]) -> None:
    """Each LoRA target names a module of the model (the last part of its path), or what peft
    adapts under that name (a fused expert's parameter): peft refuses a list where none matches only
    once the model has loaded, and ignores silently one name of several that matches nothing. The
    model is built from its config on torch's meta device: no weights are made or read."""
    try:
        names, unmatched = _target_names(_config_key(config), tuple(targets))
    except Exception:  # a config transformers cannot build here: the loader will say so
        log.debug("the model's modules could not be listed before loading", exc_info=True)
        return
    if unmatched:
        raise ConfigError(f"recovery.lora.targets={targets}: {unmatched} name(s) no module of model={model!r}; its "
                          f"Linear layers are named {names}")


def _config_key(config) -> str:
    return config.to_json_string() if hasattr(config, "to_json_string") else json.dumps(config, sort_keys=True)


@functools.cache
def _target_names(config_key: str, targets: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the model's Linear layers' names, the targets that name nothing peft adapts): a module's
    last name, or a fused expert parameter's (a 3-d `gate_up_proj`, which peft adapts for the targets
    gate_proj and up_proj as for gate_up_proj)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    stated = json.loads(config_key)
    built = PretrainedConfig.from_dict(stated) if "model_type" not in stated else AutoConfig.for_model(**stated)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(built)
    names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.dim() >= 3:
                names |= {name, *(f"{part}_proj" for part in FUSED.findall(name))}
    linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    return linear, [t for t in targets if t not in names]


# the projections a fused parameter's name joins (gate_up_proj: gate, up)
FUSED = re.compile(r"([a-z]+)_(?=[a-z_]*proj$)")
