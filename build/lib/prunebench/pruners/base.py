from __future__ import annotations

from typing import ClassVar

import torch

from prunebench.models.loaded import LoadedModel


class Pruner:
    """A scorer plus how its scores become a pruned model.

    `families` says which model families the pruner can apply to; it is read from the class
    before any model loads, so a mismatch fails fast."""

    families: ClassVar[frozenset[str]] = frozenset()
    needs_calibration: ClassVar[bool] = False
    cacheable: ClassVar[bool] = True

    def __init__(self, name: str):
        self.name = name

    def check(self, sparsity: float) -> None:
        """Raise ValueError if this pruner cannot produce `sparsity` (called before any model loads)."""

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, torch.Tensor] | None:
        return None

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        raise NotImplementedError

    def start_task(self, task: str) -> None:
        """Called before each task is evaluated: a pruner that observes the model at work (MoE
        routing) starts counting afresh here."""

    def task_metrics(self, task: str) -> dict[str, float]:
        """What it observed during `task`, named `<task>/...`."""
        return {}

    def task_artifacts(self, task: str) -> dict[str, object]:
        """Artifact path -> JSON-able dict or matplotlib figure, observed during `task`."""
        return {}


class NoPruner(Pruner):
    """The dense baseline."""

    families = frozenset({"causal_lm", "encoder", "vision", "moe", "vlm"})
    cacheable = False

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        return {}


def transformer_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The repeated blocks (decoder layers, encoder layers): the ModuleList as long as the
    config's layer count. Embeddings and heads live outside it and are never pruned."""
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return name, module
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} "
                     f"(no ModuleList of num_hidden_layers={n_layers})")


def block_linears(model: torch.nn.Module, skip_layers=()) -> dict[str, torch.nn.Linear]:
    prefix, blocks = transformer_blocks(model)
    out = {}
    for idx, block in enumerate(blocks):
        if idx in set(skip_layers):
            continue
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear):
                out[f"{prefix}.{idx}.{name}"] = module
    return out


def parameter_counts(model: torch.nn.Module) -> dict[str, float]:
    total = sum(p.numel() for p in model.parameters())
    nonzero = sum(int(torch.count_nonzero(p)) for p in model.parameters())
    return {"params/total": float(total), "params/nonzero": float(nonzero)}
