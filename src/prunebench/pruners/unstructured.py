"""Unstructured pruning of the Linear weights inside the transformer blocks."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner, block_linears


def prune_lowest(weight: torch.Tensor, score: torch.Tensor, sparsity: float) -> None:
    """Zero exactly floor(numel x sparsity) entries with the lowest scores (stable on ties)."""
    k = int(weight.numel() * sparsity)
    if k:
        order = torch.argsort(score.flatten().float(), stable=True)[:k]
        weight.view(-1)[order] = 0


class MagnitudePruner(Pruner):
    """|W| compared within each layer (the standard magnitude baseline)."""

    families = frozenset({"causal_lm", "encoder", "moe", "vlm"})
    cacheable = False  # its scores are the weights themselves

    def __init__(self, name: str = "magnitude", skip_layers: list[int] = ()):
        super().__init__(name)
        self.skip_layers = list(skip_layers)

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        zeros = total = 0
        with torch.no_grad():
            for linear in block_linears(loaded.model, self.skip_layers).values():
                prune_lowest(linear.weight, linear.weight.abs(), sparsity)
                zeros += int((linear.weight == 0).sum())
                total += linear.weight.numel()
        return {"sparsity/actual": zeros / total}
