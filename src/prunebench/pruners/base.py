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
