"""Checks of the recovery's own options, before any model loads (validate.py calls them with the
other recovery checks); each raises ValueError naming the value and what would be valid."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
LOSS_SCALINGS = ("tokens", "micro_batches")
WINDOWS = ("random", "disjoint")
# more optimizer steps than a pretraining runs (Llama 2: 500k): a typo, and a run that would not end
MAX_STEPS = 10_000_000


def number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def scheduler_names() -> list[str]:
    from transformers import SchedulerType

    return [s.value for s in SchedulerType]


def check_options(options: dict) -> None:
    """`options`: the resolved `recovery` config."""
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
    check_optimizer(options)
    check_lora(options.get("lora") or {}, options.get("parameters", "lora"))
    steps, warmup = options.get("max_steps"), options.get("warmup_steps") or 0
    if steps and warmup >= steps:
        horizon = options.get("schedule_steps") or steps
        reached = options["lr"] * (steps - 1) / warmup  # the schedule's rate at the last step (counted from 0)
        raise ValueError(f"recovery.max_steps={steps} ends inside recovery.warmup_steps={warmup}: the whole run would be "
                         f"warm-up, the learning rate rising from 0 to {reached:.3g} at step {steps} and never reaching "
                         f"recovery.lr={options['lr']:g} (the schedule runs over {horizon} steps); set "
                         f"recovery.warmup_steps below {steps}, e.g. recovery.warmup_steps={max(steps // 10, 0)}")


def check_optimizer(options: dict) -> None:
    """The schedule and optimizer settings each as transformers' and torch's AdamW take them; each
    of these used to be accepted here and to fail (or act otherwise) inside the training."""
    from prunebench.corpora import ALPACA_TEMPLATES

    template = options.get("template", "alpaca")
    if template not in ALPACA_TEMPLATES:
        raise ValueError(f"recovery.template={template!r}; valid: {sorted(ALPACA_TEMPLATES)}")
    schedule = options.get("schedule", "linear")
    if schedule not in (names := scheduler_names()):
        raise ValueError(f"recovery.schedule={schedule!r} is not one of transformers' schedules: {names}")
    betas = options.get("betas", [0.9, 0.999])
    if not isinstance(betas, (list, tuple)) or len(betas) != 2 or not all(number(b) and 0 <= b < 1 for b in betas):
        raise ValueError(f"recovery.betas={betas!r} must be two numbers in [0, 1) (AdamW's decay rates of its "
                         f"gradient averages, e.g. [0.9, 0.999])")
    decay = options.get("weight_decay", 0.0)
    if not number(decay) or decay < 0:
        raise ValueError(f"recovery.weight_decay={decay!r} must be a number, 0 or more (a negative decay pushes the "
                         f"weights away from 0)")
    warmup = options.get("warmup_steps", 0)
    if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
        raise ValueError(f"recovery.warmup_steps={warmup!r} must be a whole number of optimizer steps, 0 or more")
    clip = options.get("max_grad_norm")
    if clip is not None and (not number(clip) or clip <= 0):
        raise ValueError(f"recovery.max_grad_norm={clip!r} must be a positive number; null turns clipping off (a "
                         f"value of 0 or less turned it off silently)")
    steps = options.get("max_steps")
    if isinstance(steps, int) and steps > MAX_STEPS:
        raise ValueError(f"recovery.max_steps={steps} is more optimizer steps than a pretraining runs (at most "
                         f"{MAX_STEPS:,}): a run that would not end; give the steps meant, or null for the epochs'")
    every, patience = options.get("val_every"), options.get("early_stopping_patience")
    if patience and isinstance(steps, int) and isinstance(every, int) and every > steps:
        log.warning("recovery.val_every=%d is beyond recovery.max_steps=%d: no validation runs before the end, so "
                    "recovery.early_stopping_patience=%d never stops anything; set recovery.val_every<=%d",
                    every, steps, patience, steps)


def check_lora(lora: dict, parameters: str) -> None:
    if parameters != "lora":
        return
    rank, alpha, dropout = lora.get("r"), lora.get("alpha"), lora.get("dropout", 0.0)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"recovery.lora.r={rank!r} must be a positive integer (the adapter's rank)")
    if not number(alpha) or alpha <= 0:
        raise ValueError(f"recovery.lora.alpha={alpha!r} must be a positive number (the adapter's scale is alpha / r)")
    if not number(dropout) or not 0 <= dropout < 1:
        raise ValueError(f"recovery.lora.dropout={dropout!r} must be a number in [0, 1)")
    targets = lora.get("targets")
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"recovery.lora.targets={targets!r} must be a non-empty list of module names")
