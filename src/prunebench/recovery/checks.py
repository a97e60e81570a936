"""Checks of the recovery's own options, before any model loads (validate.py calls them with the
other recovery checks); each raises ValueError naming the value and what would be valid."""

from __future__ import annotations

LOSS_SCALINGS = ("tokens", "micro_batches")
WINDOWS = ("random", "disjoint")


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
    steps, warmup = options.get("max_steps"), options.get("warmup_steps") or 0
    if steps and warmup >= steps:
        horizon = options.get("schedule_steps") or steps
        reached = options["lr"] * (steps - 1) / warmup  # the schedule's rate at the last step (counted from 0)
        raise ValueError(f"recovery.max_steps={steps} ends inside recovery.warmup_steps={warmup}: the whole run would be "
                         f"warm-up, the learning rate rising from 0 to {reached:.3g} at step {steps} and never reaching "
                         f"recovery.lr={options['lr']:g} (the schedule runs over {horizon} steps); set "
                         f"recovery.warmup_steps below {steps}, e.g. recovery.warmup_steps={max(steps // 10, 0)}")
