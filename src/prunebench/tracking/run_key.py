"""A job's identity: a hash of what determines its numbers, not of where or how it ran."""

from __future__ import annotations

import copy

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from prunebench.api.model_keys import PLANNING_KEYS, run_dtype
from prunebench.cache import content_key

# Fields that change where or how fast a job runs, never its numbers.
# `vision_data` holds a vision preset's data paths, which reach the numbers' fields by interpolation.
RUNTIME_KEYS = ("tracking", "trainer", "hydra", "fail_fast", "plan", "vision_data")
# model-config keys that never change a job's numbers
MODEL_RUNTIME_KEYS = ("device", "device_map", *PLANNING_KEYS)
DENSE_PRUNER = {"_target_": "prunebench.pruners.base.NoPruner", "name": "none"}


def is_dense(cfg: DictConfig) -> bool:
    return cfg.pruner.name == "none" or float(cfg.sparsity) == 0.0


def identity(cfg: DictConfig) -> dict:
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in RUNTIME_KEYS:
        data.pop(key, None)
    if "dtype" in data.get("model", {}):
        data["model"]["dtype"] = run_dtype(cfg.model)
    for key in MODEL_RUNTIME_KEYS:
        data.get("model", {}).pop(key, None)
    data.get("eval", {}).pop("batch_tokens", None)
    task = data.get("task", {})
    # only the protocol that runs decides the numbers: OpenCompass's versions leave lm-eval runs alone
    offered = task.pop("protocols", None) or {}
    if task.get("protocol") in offered:
        task["protocols"] = {task["protocol"]: offered[task["protocol"]]}
    if is_dense(cfg):
        data["pruner"] = dict(DENSE_PRUNER)
        data["sparsity"] = 0.0
    if is_dense(cfg) or not get_class(data["pruner"]["_target_"]).needs_calibration:
        data.pop("calib", None)
    return data


def run_key(cfg: DictConfig) -> str:
    return content_key(identity(cfg))


def dense_config(cfg: DictConfig) -> DictConfig:
    dense = copy.deepcopy(cfg)
    with_struct = OmegaConf.is_struct(dense)
    OmegaConf.set_struct(dense, False)
    dense.pruner = DENSE_PRUNER
    dense.sparsity = 0.0
    OmegaConf.set_struct(dense, with_struct)
    return dense


def dense_key(cfg: DictConfig) -> str:
    return run_key(dense_config(cfg))
