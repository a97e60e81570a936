"""A recovery's options (`conf/recovery/*.yaml`), checked before any model loads: its choices, its
counts, the model family it trains, a sequence length the model reads, and its data."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.api.seeds import torch_seed
from prunebench.hub import deferring
from prunebench.models.pretrained import POSITION_KEYS
from prunebench.recovery.data import recovery_data

# the families whose causal LM a recovery trains (an adapter on their Linear projections)
RECOVERY_FAMILIES = ("causal_lm", "moe")
CHOICES = {"objective": ("lm", "distill"), "parameters": ("lora", "full")}
COUNTS = ("seq_len", "batch_size", "micro_batch_size", "epochs", "val_samples", "val_every")
OPTIONAL_COUNTS = ("max_steps", "n_samples", "early_stopping_patience")
POSITIVE = ("lr", "temperature")
LOSS_SCALINGS = ("tokens", "micro_batches")
WINDOWS = ("random", "disjoint")


def positive_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def check_recovery(cfg: DictConfig, context: int | None, deferred: list[str] | None = None) -> None:
    """recovery=...: its options, the model family, a sequence length the model reads (`context`,
    None: not known), and its data (there, non-empty, the alpaca schema, one batch besides the
    held-out examples). The caller checks only a job that recovers (a dense job trains nothing)."""
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


def check_options(options: dict) -> None:
    """How the steps are scaled and scheduled and the windows drawn (`options`: the resolved `recovery`
    config); ValueError naming the value and what would be valid."""
    scaling = options.get("loss_scaling", "tokens")
    if scaling not in LOSS_SCALINGS:
        raise ValueError(f"recovery.loss_scaling={scaling!r}; valid: {list(LOSS_SCALINGS)} (tokens: the step's loss "
                         f"divided by its labelled tokens, as transformers' Trainer since 4.46; micro_batches: the "
                         f"mean of the micro-batches' means, as before it)")
    windows = options.get("windows", "random")
    if windows not in WINDOWS:
        raise ValueError(f"recovery.windows={windows!r}; valid: {list(WINDOWS)}")
    horizon = options.get("schedule_steps")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"recovery.schedule_steps={horizon!r} must be a positive integer or null (the training's steps)")
    steps, warmup = options.get("max_steps"), options.get("warmup_steps") or 0
    if steps and warmup >= steps:
        horizon = options.get("schedule_steps") or steps
        reached = options["lr"] * (steps - 1) / warmup  # the schedule's rate at the last step (counted from 0)
        raise ValueError(f"recovery.max_steps={steps} ends inside recovery.warmup_steps={warmup}: the whole run would be "
                         f"warm-up, the learning rate rising from 0 to {reached:.3g} at step {steps} and never reaching "
                         f"recovery.lr={options['lr']:g} (the schedule runs over {horizon} steps); set "
                         f"recovery.warmup_steps below {steps}, e.g. recovery.warmup_steps={max(steps // 10, 0)}")
