"""What structured pruners share: calibration batches, a loss, and the report of what a change of
shapes bought (parameters and FLOPs removed, beside the ratio in the pruner's own unit)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from prunebench.models.flops import forward_flops
from prunebench.models.introspection import count_parameters, model_outputs
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner


def calibration_batches(loaded: LoadedModel, calib, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Batches as dicts of model inputs.

    A calibration source with labels (one that has `batches(loaded, batch_size)`, e.g. a task's
    training split for a classifier) supplies its own dicts: `input_ids`/`attention_mask`/`labels`
    for text, `pixel_values`/`labels` for images. Plain text windows (`samples(tokenizer)`) become
    token batches; a causal LM's (or a vision-language model's) windows are labelled with themselves
    (the LM loss). A vision-language task's labelled batches carry images and label only the answer."""
    if hasattr(calib, "batches"):
        return list(calib.batches(loaded, batch_size))
    ids = calib.samples(loaded.tokenizer).to(loaded.device)
    labelled = loaded.family in ("causal_lm", "vlm")
    return [{"input_ids": chunk, **({"labels": chunk} if labelled else {})} for chunk in ids.split(batch_size)]


def observe(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """A forward pass for hooks to watch, without the LM or task head where transformers can
    leave it out (`get_decoder()`): on a small LM with a large vocabulary the head is most of
    the cost, and no statistic needs it. A vision-language model's image+text batch runs its base
    model (vision tower, projector and language model, no LM head)."""
    if "pixel_values" in batch and "input_ids" not in batch:
        return model(batch["pixel_values"])
    body = (model.base_model if "pixel_values" in batch else
            model.get_decoder() if hasattr(model, "get_decoder") else model)
    return body(**{k: v for k, v in batch.items() if k != "labels"})


def model_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss a gradient scorer differentiates: the model's own (LM or task loss, computed by
    transformers from `labels`), or cross-entropy on a vision model's logits."""
    if "labels" not in batch:
        raise ValueError("a gradient scorer needs labelled calibration batches: an LM loss for causal LMs, a "
                         "task loss for classifiers (an encoder without a task head has no loss to differentiate)")
    out = model_outputs(model, batch)
    if isinstance(out, torch.Tensor):
        return F.cross_entropy(out, batch["labels"])
    if out.loss is None:
        raise ValueError(f"{type(model).__name__} computes no loss from `labels`; give it a task head")
    return out.loss


class StructuredPruner(Pruner):
    """A pruner that changes shapes. `prune` returns the ratio in its own unit (`sparsity/actual`)
    and anything else it measured; `apply` adds the fraction of the model's parameters and forward
    FLOPs it removed, and the FLOPs left (per token for text, per image for vision)."""

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        raise NotImplementedError

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        params, flops = count_parameters(loaded.model), forward_flops(loaded)
        stats = self.prune(loaded, scores, sparsity)
        after = forward_flops(loaded)
        (name, value), = after.items()
        return {**stats, "sparsity/params": 1 - count_parameters(loaded.model) / params, name: value,
                "sparsity/flops": 1 - value / flops[name]}


@contextmanager
def differentiable_only(model: torch.nn.Module, params=()):
    """Gradients for `params` alone (none: every weight frozen, while a scorer differentiates its
    gates): the embeddings, norms and LM head keep none, and the graph saves nothing for them."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
