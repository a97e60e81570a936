"""A job's identity: a hash of what determines its numbers, not of where or how it ran."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, flag_override, open_dict

from prunebench.api.model_keys import PLANNING_KEYS, run_dtype
from prunebench.cache import content_key

# Fields that change where or how fast a job runs, never its numbers.
# `vision_data` holds a vision preset's data paths, which reach the numbers' fields by interpolation.
# `judge` reaches the numbers only through the judged tasks' own `judge` field (by interpolation).
# `export`, `export_dir`, `export_padded`: a copy of the pruned model written after the numbers are made.
RUNTIME_KEYS = ("tracking", "trainer", "hydra", "fail_fast", "plan", "detach", "vision_data", "judge", "export", "export_dir", "export_padded")
# model-config keys that never change a job's numbers
MODEL_RUNTIME_KEYS = ("device", "device_map", *PLANNING_KEYS)
# judge-config keys that say how to reach the judge, not which model grades
JUDGE_RUNTIME_KEYS = ("url", "api_key_env", "max_retries", "timeout_s", "device", "name")
# the judge's protocol at what judges did before these keys existed: runs stored then still match
JUDGE_DEFAULTS = {"repeats": 1, "max_failure_rate": 0.05}
DENSE_PRUNER = {"_target_": "prunebench.pruners.base.NoPruner", "name": "none"}


def is_dense(cfg: DictConfig) -> bool:
    return cfg.pruner.name == "none" or float(cfg.sparsity) == 0.0


def recovering(cfg: DictConfig) -> bool:
    """A recovery fine-tune is configured (recovery=none, or a config from before the group, has none)."""
    return OmegaConf.select(cfg, "recovery.name", default="none") != "none"


def identity(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> dict:
    """`inputs`: the digests of the local data the job reads ({context: {path: digest}}, inputs.py),
    so a changed file is a new run; calibration data counts only where calibration does. The root
    `seed` reaches the numbers only through the fields that interpolate it (a random pruner's, a
    calibration's, the latency prompt's): where none is left (a dense run, a magnitude pruner), it is
    no part of the identity, so `seed=0,1` evaluates the dense model once."""
    data = fields(cfg, inputs)
    if "seed" in data:
        with seed_set(cfg, f"{cfg.seed}-probe") as other:  # any other value: what resolves from it changes with it
            probe = fields(other, inputs)
        if {k: v for k, v in probe.items() if k != "seed"} == {k: v for k, v in data.items() if k != "seed"}:
            data.pop("seed")
    return data


@contextmanager
def seed_set(cfg: DictConfig, value: str) -> Iterator[DictConfig]:
    """`cfg` with its root seed set to `value` inside the block and as it was after it: set in place,
    since a deep copy of a job's config costs as much as resolving it (a plan keys each job twice);
    a seed written as an interpolation is set on a copy, so that it stays written as it was."""
    if OmegaConf.is_interpolation(cfg, "seed"):
        other = copy.deepcopy(cfg)
        with open_dict(other):
            other.seed = value
        yield other
        return
    seed = cfg.seed
    with flag_override(cfg, ["readonly", "struct"], False):
        cfg.seed = value
        try:
            yield cfg
        finally:
            cfg.seed = seed


def fields(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None) -> dict:
    """The resolved config without what never changes a job's numbers."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in RUNTIME_KEYS:
        data.pop(key, None)
    if "dtype" in data.get("model", {}):
        data["model"]["dtype"] = run_dtype(cfg.model)
    for key in MODEL_RUNTIME_KEYS:
        data.get("model", {}).pop(key, None)
    evaluation = data.get("eval", {})
    evaluation.pop("batch_tokens", None)
    # the fast scorer is what ran before eval.numerics existed: runs stored then still match
    if evaluation.get("numerics") == "fast":
        evaluation.pop("numerics")
        evaluation.pop("lm_eval_batch_size", None)
    # raw prompts are what every run did before the chat options existed: runs stored then still match
    for key, default in (("chat_template", False), ("fewshot_as_multiturn", False), ("system_instruction", None)):
        if key in evaluation and evaluation[key] is default:
            evaluation.pop(key)
    task = data.get("task", {})
    # only the protocol that runs decides the numbers: OpenCompass's versions leave lm-eval runs alone
    offered = task.pop("protocols", None) or {}
    if task.get("protocol") in offered:
        task["protocols"] = {task["protocol"]: offered[task["protocol"]]}
    # pruner.tower=language is what every pruner did before the key existed: runs stored then still match
    if data.get("pruner", {}).get("tower") == "language":
        data["pruner"].pop("tower")
    for definition in (task.get("tasks") or {}).values():
        judge = definition.get("judge") or {}
        for key in JUDGE_RUNTIME_KEYS:
            judge.pop(key, None)
        for key, default in JUDGE_DEFAULTS.items():
            if judge.get(key) == default:
                judge.pop(key)
    # no recovery is what every run did before the group existed, and a dense model is not recovered
    # (the papers' baseline): runs stored then, and dense baselines, keep their keys
    if not recovering(cfg) or is_dense(cfg):
        data.pop("recovery", None)
    else:  # how often a recovery is checkpointed changes none of its numbers
        data["recovery"].pop("checkpoint_every", None)
    if is_dense(cfg):
        data["pruner"] = dict(DENSE_PRUNER)
        data["sparsity"] = 0.0
    if is_dense(cfg) or not get_class(data["pruner"]["_target_"]).needs_calibration:
        data.pop("calib", None)
    read = {context: files for context, files in (inputs or {}).items()
            if (context != "calib" or "calib" in data) and (context != "recovery" or "recovery" in data)}
    if read:  # a job reading only hub datasets keeps the key it had before inputs were keyed
        data["inputs"] = read
    return data


def run_key(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> str:
    return content_key(identity(cfg, inputs))


def dense_config(cfg: DictConfig) -> DictConfig:
    dense = copy.deepcopy(cfg)
    with_struct = OmegaConf.is_struct(dense)
    OmegaConf.set_struct(dense, False)
    dense.pruner = DENSE_PRUNER
    dense.sparsity = 0.0
    OmegaConf.set_struct(dense, with_struct)
    return dense


def dense_key(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> str:
    return run_key(dense_config(cfg), inputs)
