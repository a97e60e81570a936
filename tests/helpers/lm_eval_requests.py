"""prunebench's requests and per-document records of an lm-eval task, in the form lm-eval's own are compared with."""

from __future__ import annotations

from lightning import Trainer
from omegaconf import OmegaConf

from prunebench.evaluation.registry import evaluation


def our_requests(task) -> list[list[tuple[str, str]]]:
    return [list(zip(i.contexts, i.continuations)) for i in task.instances()]


def our_records(loaded, task, add_bos=None, limit=None, numerics="fast", lm_eval_batch_size=1) -> list[dict]:
    options = OmegaConf.create({"batch_tokens": 512, "add_bos": add_bos, "numerics": numerics,
                                "lm_eval_batch_size": lm_eval_batch_size})
    data, module = evaluation(task, loaded, limit, options)
    Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        module, datamodule=data, verbose=False)
    return sorted(module.records, key=lambda r: r["doc_id"])

