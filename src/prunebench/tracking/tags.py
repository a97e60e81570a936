"""What a job's MLflow run is labelled with: its config as flat params, and the tags a report, the
UI's filter and a sweep's resume read (run key, model, pruner, task, sparsity, dtype, recovery)."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from prunebench.api.model_keys import run_dtype
from prunebench.tracking import store
from prunebench.tracking.run_key import is_dense, recovering


def flatten(data, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


def job_tags(cfg: DictConfig, key: str, overrides: list[str]) -> dict[str, str]:
    return {store.KEY_TAG: key, **setting_tags(cfg), "git.sha": store.git_sha(), "hydra.overrides": " ".join(overrides)}


def setting_tags(cfg: DictConfig) -> dict[str, str]:
    """The tags that say what the job computes (model, pruner, task, sparsity, ...), read from its
    config alone: a plan matches a job to stored runs by them."""
    dense = is_dense(cfg)
    return {"prunebench.model": cfg.model.name, "prunebench.pruner": "none" if dense else cfg.pruner.name,
            "prunebench.task": cfg.task.name, "prunebench.sparsity": str(0.0 if dense else float(cfg.sparsity)),
            # whose prompts and scoring ran (task.protocol: lm_eval, opencompass)
            **({"prunebench.protocol": cfg.task.protocol} if cfg.task.get("protocol") else {}),
            **({"prunebench.dtype": run_dtype(cfg.model)} if cfg.model.get("dtype") else {}),
            **({"prunebench.recovery": cfg.recovery.name} if recovering(cfg) and not dense else {}),
            # a checkpoint's own code ran: worth seeing beside its numbers
            **({"prunebench.trust_remote_code": "true"} if cfg.model.get("trust_remote_code") else {})}
