"""One task evaluated on a model: its request kind's engine (registry.py) run in Lightning's test
loop, with the per-document progress bar, the truncation count and each metric's standard error."""

from __future__ import annotations

import logging

from hydra.utils import instantiate
from omegaconf import DictConfig

from prunebench.api.metrics import readable
from prunebench.evaluation.registry import prepared
from prunebench.models.offload import left_in_place

log = logging.getLogger(__name__)


def evaluate_task(cfg: DictConfig, loaded, name: str, task) -> tuple[dict[str, float], list[dict], int | None]:
    """(metrics, records, the positions the model ran: progress.positions, None where not counted)."""
    from prunebench.evaluation.progress import DocumentProgress

    data, module, work = prepared(task, loaded, cfg.get("limit"), cfg.eval)
    # Lightning's own bar counts batches; ours counts documents, shown where Lightning's would be
    progress = [DocumentProgress(name, work)] if cfg.trainer.get("enable_progress_bar", True) else []
    trainer = instantiate(cfg.trainer, enable_progress_bar=False, callbacks=progress)
    with left_in_place(loaded.model):
        results = trainer.test(module, datamodule=data, verbose=False)[0]
    metrics = {key: readable(float(value)) for key, value in results.items()}
    truncated = getattr(data, "truncated", None)  # counted by the engines that cut prompts (loglikelihood, generation)
    if truncated is not None:
        metrics[f"{name}/n_truncated"] = float(truncated)
        if truncated:
            log.warning("task %s: %d of %d documents were cut from the left to fit the model's %d positions "
                        "(their start unread; metric %s/n_truncated)", name, truncated, len(module.records),
                        loaded.max_length, name)
    for metric in task.metrics:
        metrics[f"{name}/{metric}_stderr"] = module.stderr(metric)
    return metrics, module.records, work
