"""Relative importance and activations (RIA; Zhang et al. 2024, "Plug-and-Play"), written against
prunebench's pruner contract as a lab would write its own method.

The contract: `score` runs once per (model, pruner config, calibration) and returns tensors,
which prunebench keeps in its score cache; `apply` turns them into a pruned model for one sparsity
and runs once per ratio. The class attributes tell validation, before any model loads, which model
families and towers the pruner takes and whether it needs calibration data.

Not a reproduction of the paper: its channel permutation for N:M patterns is left out, and the
weights compared with each other are `scope`'s (each output row by default, as Wanda)."""

from __future__ import annotations

import torch

from prunebench.pruners.activations import input_square_sums
from prunebench.pruners.structured import calibration_batches
from prunebench.pruners.unstructured import UnstructuredPruner


class RelativeImportancePruner(UnstructuredPruner):
    """(|W_ij| / sum_k |W_ik| + |W_ij| / sum_k |W_kj|) x ||X_j||_2^alpha: a weight's share of its
    output row and of its input column, scaled by its input's activation norm on calibration data."""

    families = frozenset({"causal_lm", "vlm"})  # a vision-language model: its language tower (Pruner.towers)
    needs_calibration = True

    def __init__(self, name: str = "ria", alpha: float = 0.5, scope: str = "row", **options):
        super().__init__(name, scope=scope, **options)
        if alpha < 0:
            raise ValueError(f"pruner.alpha={alpha} must be >= 0 (the exponent of the activation norm)")
        self.alpha = alpha

    def score(self, loaded, calib=None) -> dict[str, torch.Tensor]:
        """sum of x_j^2 over the calibration tokens, per input feature of each matrix: the one pass
        over calibration data, independent of the sparsity, so every ratio of a sweep reuses it."""
        return input_square_sums(loaded.model, self.targets(loaded.model), calibration_batches(loaded, calib, 1))

    def importance(self, targets, scores) -> dict[str, torch.Tensor]:
        out = {}
        for name, matrix in targets.items():
            w = matrix.weight.abs().float()
            relative = w / w.sum(1, keepdim=True).clamp_min(1e-12) + w / w.sum(0, keepdim=True).clamp_min(1e-12)
            out[name] = relative * scores[name].sqrt().pow(self.alpha).to(w)[None, :]
        return out
