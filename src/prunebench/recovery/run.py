"""The job's recovery step: the pruned model fine-tuned in place as `recovery` says, in a working
folder keyed by the run key (checkpoints to resume from, the adapter for the export)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from prunebench.cache import cache_dir
from prunebench.models.cache import get_model
from prunebench.models.introspection import count_parameters
from prunebench.models.loaded import LoadedModel
from prunebench.recovery.data import recovery_data


def recovery_folder(key: str) -> Path:
    """A recovered run's working folder, keyed by its run key, in the prunebench cache: the LoRA
    adapter as trained (for the export) and the checkpoints live there until the job ends."""
    return cache_dir("recovery", key)


def recover_model(cfg: DictConfig, loaded: LoadedModel, folder: Path) -> dict[str, float]:
    """The pruned model fine-tuned as `recovery` says (train.py), in place: what is evaluated and
    exported is the recovered model. Distillation's teacher is the dense model read again as the job
    read it (models/cache.py: from its files, or a copy of the one built from a config).
    `recovery/nonzero_delta`: nonzero weights after minus before, 0 when the pruning's zeros were
    kept, so `sparsity/actual` still describes the evaluated model."""
    from prunebench.recovery.train import recover

    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    teacher = get_model(cfg.model).model.requires_grad_(False) if options["objective"] == "distill" else None
    nonzero = count_parameters(loaded.model, nonzero=True)
    metrics, _ = recover(loaded, options, recovery_data(cfg), cfg.trainer, teacher, folder)
    metrics["recovery/nonzero_delta"] = float(count_parameters(loaded.model, nonzero=True) - nonzero)
    return metrics
