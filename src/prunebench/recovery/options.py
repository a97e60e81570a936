"""A recovery's options (`conf/recovery/*.yaml`), checked before any model loads: its choices, its
counts, the model family it trains, a sequence length the model reads, and its data."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.api.seeds import torch_seed
from prunebench.hub import deferring
from prunebench.models.pretrained import POSITION_KEYS
from prunebench.recovery.checks import check_options
from prunebench.recovery.data import recovery_data

# the families whose causal LM a recovery trains (an adapter on their Linear projections)
RECOVERY_FAMILIES = ("causal_lm", "moe")
CHOICES = {"objective": ("lm", "distill"), "parameters": ("lora", "full")}
COUNTS = ("seq_len", "batch_size", "micro_batch_size", "epochs", "val_samples", "val_every")
OPTIONAL_COUNTS = ("max_steps", "n_samples", "early_stopping_patience")
POSITIVE = ("lr", "temperature")


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
