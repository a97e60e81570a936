"""A recovery's options (`conf/recovery/*.yaml`), checked before any model loads: its choices, its
counts, its optimizer's and adapter's settings, the model family it trains, the modules its LoRA
targets name, a sequence length the model reads, and its data."""

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
from prunebench.recovery.data import recovery_data

log = logging.getLogger(__name__)
# the families whose causal LM a recovery trains (an adapter on their Linear projections)
RECOVERY_FAMILIES = ("causal_lm", "moe")
CHOICES = {"objective": ("lm", "distill"), "parameters": ("lora", "full")}
COUNTS = ("seq_len", "batch_size", "micro_batch_size", "epochs", "val_samples", "val_every")
OPTIONAL_COUNTS = ("max_steps", "n_samples", "early_stopping_patience")
POSITIVE = ("lr", "temperature")
LOSS_SCALINGS = ("tokens", "micro_batches")
WINDOWS = ("random", "disjoint")
# more optimizer steps than a pretraining runs (Llama 2: 500k): a typo, and a run that would not end
MAX_STEPS = 10_000_000


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
    if rec.n_samples is not None and data.records:
        log.warning("recovery.n_samples=%s is read only for text (windows drawn from it); the records of "
                    "recovery.data=%s are each one example, all of them used: n_samples has no effect here",
                    rec.n_samples, data.name)
    shared = {name: ids for name, task in (tasks or {}).items() if (ids := data.data_ids() & task_data_ids(task))}
    if shared and not rec.get("allow_eval_split", False):
        raise ConfigError(f"recovery.data={data.name} trains on data that is evaluated ({shared}): the recovered model "
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
    check_optimizer(options)
    check_lora(options.get("lora") or {}, options.get("parameters", "lora"))
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


def number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def scheduler_names() -> list[str]:
    from transformers import SchedulerType

    return [s.value for s in SchedulerType]


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
