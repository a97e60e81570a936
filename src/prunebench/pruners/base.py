from __future__ import annotations

from typing import ClassVar

import torch

from prunebench.models.introspection import TOWERS
from prunebench.models.loaded import LoadedModel


def tower_hint(scope) -> str:
    """`scope` ranks weights or heads; the part of a vision-language model pruned is `tower`."""
    return (f" (scope is where weights are ranked; a vision-language model's part is pruner.tower={scope})"
            if scope in TOWERS else "")


def config_value(config, key: str):
    """`key` of the config `check_config` is given: a tiny model's dict, a checkpoint's transformers
    config, or None (not known before loading); None where it is not set."""
    if config is None:
        return None
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


class Pruner:
    """A scorer plus how its scores become a pruned model.

    `families` says which model families the pruner can apply to, `towers` which parts of a
    vision-language model it can act on (`tower`: the language model, the vision tower, or both);
    both are read from the class before any model loads, so a mismatch fails fast. No pruner acts
    on a vision-language model's projector."""

    families: ClassVar[frozenset[str]] = frozenset()
    towers: ClassVar[frozenset[str]] = frozenset({"language"})
    needs_calibration: ClassVar[bool] = False
    # False: `score` is not stored in the score cache. A pruner whose option decides it (wanda's
    # `sequential`) sets it on the instance; plan.work_class reads the instance too
    cacheable: bool = True
    # options that change only how the scores are applied, not the scores: left out of the score
    # cache's key (pruning.score_identity), so runs differing in them share one scoring
    unscored: ClassVar[frozenset[str]] = frozenset()
    # False: the pruner changes how the model runs, not its weights, so an export has nothing to write
    exportable: ClassVar[bool] = True
    # why an export is refused, where `exportable` is False for another reason than the one above
    export_refusal: ClassVar[str] = ""
    # why pruning.onload (one decoder block at a time on the device: models/offload.py) is refused; ""
    # for a pruner that reads and edits weights block by block (an instance may refuse for an option)
    onload_refusal: str = "it reads or reshapes weights of several blocks at once, which onloading does not bring"

    def __init__(self, name: str, tower: str = "language"):
        self.check_tower(name, tower)
        self.name, self.tower = name, tower

    @classmethod
    def check_tower(cls, name: str, tower: str, model_name: str | None = None) -> None:
        """`tower` names a part of a vision-language model this pruner can act on."""
        if tower not in TOWERS:
            raise ValueError(f"pruner={name!r}: pruner.tower={tower!r}; valid: {list(TOWERS)}")
        if tower not in cls.towers:
            of = f" of model={model_name!r}" if model_name else ""
            raise ValueError(f"pruner={name!r} cannot prune the {tower} tower{of}; it prunes: {sorted(cls.towers)} "
                             f"(vision-tower pruning is head pruning: pruner=heads_his|heads_entropy|heads_l2|"
                             f"heads_random|hies)")

    @classmethod
    def check_target(cls, name: str, model_name: str, family: str, tower: str = "language") -> None:
        """Whether this pruner can apply to a model of `family` (and its `tower`), read from the class
        before anything is built or loaded; ValueError naming both."""
        if family not in cls.families:
            raise ValueError(f"pruner={name!r} cannot apply to model={model_name!r} (family {family!r}); it "
                             f"supports: {sorted(cls.families)}")
        if tower != "language" and family != "vlm":
            raise ValueError(f"pruner.tower={tower!r} picks a part of a vision-language model, but model="
                             f"{model_name!r} is family {family!r}; leave pruner.tower=language")
        cls.check_tower(name, tower, model_name)

    def check(self, sparsity: float) -> None:
        """Raise ValueError if this pruner cannot produce `sparsity` (called before any model loads)."""

    def check_config(self, config, sparsity: float) -> None:
        """Raise ValueError if `sparsity` cannot apply to the model its `config` (a dict, or the
        checkpoint's transformers config, read before loading) describes, e.g. more experts removed
        than top-k routing leaves room for."""

    def keyed_sparsity(self, config, sparsity: float) -> float:
        """The sparsity that names what this pruner removes from the model `config` describes: the
        asked one, unless the pruner's unit is coarse enough that two asked values remove the same
        thing (whole experts), in which case the job is recorded, and keyed, at what is removed."""
        return sparsity

    def block_work_bytes(self, shapes: list[tuple[int, int]], size: int) -> int:
        """Bytes of the statistics pruning one block holds besides its weights, for a block whose
        Linear weights have `shapes` ([out, in]) at `size` bytes a weight (a plan's memory estimate)."""
        return 0

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
    onload_refusal = ""

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        return {}
