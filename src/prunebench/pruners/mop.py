"""MoP (Mixture of Pruners, Yamamoto et al.): depth and width steps mixed to a compression ratio.

Each step is L (delete the block at index len - 3, the released code's choice; the last two always
stay) or G (remove width from every layer's heads and MLP neurons, re-scoring the current model by
activation magnitude). How much a G step removes follows `g_rule`:
- `fixed` (the default): one original block's parameters per step, by raising the width fraction F
  removed from every layer (relative to the original widths); the last step removes only what is
  left to reach the ratio, and is G when a whole block would overshoot;
- `released` (c2d-usp/Efficient-LLMs-with-MoP, `prune_groups_amp.py`): the current layer 0's
  parameter count, as a ratio p of the blocks' current attention and MLP parameters: round(p x heads)
  heads and round(p x (heads + neurons) - heads removed) neurons leave every layer (p of the MLP
  parameters, neurons only, with `mlp_only`), so later G steps shrink with the model. Steps are
  whole: the job stops after the first step that reaches the ratio, as reading the released run's
  checkpoints at that ratio would.
Sparsity is the fraction of the transformer blocks' parameters removed (`ratio_of: blocks`;
embeddings and the LM head are never pruned, and on Gemma 3 270M they are 63% of the model), or of
the whole model's (`ratio_of: model`, the released code's compression). The L/G choice comes from
`sequence` (the released code's pre-generated sequences, one per seed), a seeded random draw, or,
with `selector: perplexity`, whichever candidate gives the lower calibration perplexity; `steps`
caps the number of steps (the released scripts' iteration count). The sequence taken is logged
(tag `mop/sequence`)."""

from __future__ import annotations

import copy
import math
import random
from typing import Callable

import torch

from prunebench.models.attention import attention_heads
from prunebench.models.introspection import count_parameters, transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.models.narrow import IN_PROJS
from prunebench.pruners.layers import remove_layers
from prunebench.pruners.structured import StructuredPruner, calibration_batches, model_loss
from prunebench.pruners.width import AVERAGES, amp_scores, kept, mlp_modules, prune_width, width_of

SELECTORS = ("random", "perplexity")
G_RULES = ("fixed", "released")
RATIO_OF = ("blocks", "model")


def block_params(model: torch.nn.Module) -> int:
    return count_parameters(transformer_blocks(model)[1])


@torch.no_grad()
def perplexity(model: torch.nn.Module, batches: list[dict]) -> float:
    return math.exp(sum(float(model_loss(model, b)) for b in batches) / len(batches))


def width_sizes(model: torch.nn.Module, grouped: bool) -> list[tuple[int, float, int, int]]:
    """Per layer: (head units, parameters one unit less removes, neurons, parameters per neuron).
    A unit is one query head of every key/value group when `grouped`, else one head with its
    key and value."""
    sizes = []
    for h, mlp in zip(attention_heads(model), mlp_modules(model)):
        hidden, d = h.out_proj.out_features, h.head_dim
        if grouped:
            units, per_unit = h.n_heads // h.n_kv_heads, h.n_kv_heads * 2 * d * hidden
        else:
            units, per_unit = h.n_heads, 4 * d * hidden
        projections = sum(isinstance(getattr(mlp, n, None), torch.nn.Linear) for n in (*IN_PROJS, "down_proj"))
        sizes.append((units, per_unit, mlp.down_proj.in_features, projections * hidden))
    return sizes


def width_removal(sizes: list[tuple[int, float, int, int]], original: tuple[int, int], fraction: float) -> float:
    """Parameters (estimated) that raising the width fraction to `fraction` would remove."""
    units_kept, neurons_kept = kept(original[0], fraction), kept(original[1], fraction)
    return sum(max(units - units_kept, 0) * per_unit + max(neurons - neurons_kept, 0) * per_neuron
               for units, per_unit, neurons, per_neuron in sizes)


def released_g_step(model: torch.nn.Module, mlp_only: bool) -> tuple[int, int]:
    """(head units, neurons) every layer keeps after one G step of the released rule: p = the
    current layer 0's parameters over the blocks' attention and MLP parameters (MLP only with
    `mlp_only`); heads removed round(p x units), neurons round(p x (units + neurons) - heads removed)
    (the released formula, which prices a head like a neuron), each leaving at least one. Python's
    round (half to even) is the released code's."""
    heads, mlps = attention_heads(model), mlp_modules(model)
    unit, neurons, _ = width_of(model)
    mlp_total = sum(count_parameters(m) for m in mlps)
    p = count_parameters(transformer_blocks(model)[1][0]) / (
        mlp_total if mlp_only else mlp_total + sum(count_parameters(h.module) for h in heads))
    heads_removed = 0 if mlp_only else min(round(p * unit), unit - 1)
    neurons_removed = round(p * neurons) if mlp_only else round(p * (unit + neurons) - heads_removed)
    return unit - heads_removed, neurons - min(neurons_removed, neurons - 1)


class MoPPruner(StructuredPruner):
    families = frozenset({"causal_lm", "vlm"})  # a vision-language model's language tower
    needs_calibration = True
    cacheable = False  # every G step re-scores the model as it is by then

    def __init__(self, name: str = "mop", selector: str = "random", seed: int = 0, batch_size: int = 1,
                 sequence: str | None = None, steps: int | None = None, g_rule: str = "fixed",
                 ratio_of: str = "blocks", mlp_only: bool = False, average: str = "token",
                 tower: str = "language"):
        super().__init__(name, tower)
        for key, value, valid in (("selector", selector, SELECTORS), ("g_rule", g_rule, G_RULES),
                                  ("ratio_of", ratio_of, RATIO_OF), ("average", average, AVERAGES)):
            if value not in valid:
                raise ValueError(f"pruner {name}: {key}={value!r}; valid: {valid}")
        if sequence is not None and (not sequence or set(sequence) - {"L", "G"} or selector != "random"):
            raise ValueError(f"pruner {name}: sequence={sequence!r} must be a non-empty string of L and G, "
                             f"with selector=random (a sequence replaces the random draw)")
        if steps is not None and steps < 1:
            raise ValueError(f"pruner {name}: steps={steps!r} must be a positive number of steps or null")
        if mlp_only and g_rule != "released":
            raise ValueError(f"pruner {name}: mlp_only=true is a form of g_rule=released")
        self.selector, self.seed, self.batch_size = selector, seed, batch_size
        self.sequence, self.steps, self.g_rule = sequence, steps, g_rule
        self.ratio_of, self.mlp_only, self.average = ratio_of, mlp_only, average

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, list[dict]]:
        """MoP's importance is recomputed at every step, so scoring only fixes the calibration batches."""
        return {"batches": calibration_batches(loaded, calib, self.batch_size)}

    def measure(self, model: torch.nn.Module) -> int:
        return count_parameters(model) if self.ratio_of == "model" else block_params(model)

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        batches = scores["batches"]
        start = self.measure(loaded.model)
        target = start * (1 - sparsity)
        *original, grouped = width_of(loaded.model)
        blocks = block_params(loaded.model)
        block = blocks / len(transformer_blocks(loaded.model)[1])
        close = min(blocks / 1e4, block / 100)  # near enough to the target to stop
        width = {"fraction": 0.0}  # the fixed rule's width fraction removed so far, and a G step's next one
        rng = random.Random(self.seed)
        sequence = ""
        while self.steps is None or len(sequence) < self.steps:
            options = (self.released_options(loaded.model, target, grouped, batches) if self.g_rule == "released"
                       else self.fixed_options(loaded.model, block, close, target, original, grouped,
                                            width, batches))
            if not options:
                break
            if self.selector == "perplexity":
                trials = {}
                for c, step in options.items():
                    trials[c] = copy.deepcopy(loaded.model)
                    step(trials[c])
                choice = min(trials, key=lambda c: perplexity(trials[c], batches))
                loaded.model = trials[choice]
            else:
                choice = self.sequence[len(sequence) % len(self.sequence)] if self.sequence else rng.choice("LG")
                if choice not in options:
                    if self.g_rule == "released":
                        raise ValueError(f"MoP sequence {self.sequence}: step {len(sequence) + 1} is {choice}, "
                                         f"which the model cannot take any more (steps taken: {sequence})")
                    choice = next(iter(options))  # the fixed rule's last, partial step
                options[choice](loaded.model)
            if choice == "G" and self.g_rule == "fixed":
                width["fraction"] = width["next"]
            sequence += choice
        neurons_removed = 1 - width_of(loaded.model)[1] / original[1]
        return {"sparsity/actual": 1 - self.measure(loaded.model) / start, "mop/sequence": sequence,
                "mop/width_fraction": width["fraction"] if self.g_rule == "fixed" else neurons_removed,
                "mop/layers_removed": float(sequence.count("L")), "mop/steps": float(len(sequence))}

    def released_options(self, model, target: float, grouped: bool, batches) -> dict[str, Callable]:
        """The released rule's whole steps; none once the ratio is reached."""
        if self.measure(model) <= target * (1 + 1e-9):
            return {}
        units, neurons = released_g_step(model, self.mlp_only)
        options = {"L": self.layer_step} if len(transformer_blocks(model)[1]) > 2 else {}
        if (units, neurons) != width_of(model)[:2]:
            options["G"] = lambda m: prune_width(m, amp_scores(m, batches, self.average), units, neurons, grouped)
        return options

    def fixed_options(self, model, block: float, close: float, target: float, original: list[int],
                      grouped: bool, width: dict, batches) -> dict[str, Callable]:
        """Steps of one original block's parameters (`block`), the last one only what is left; none
        at the ratio. A G step's width fraction goes to width["next"]."""
        now = self.measure(model)
        if now - target <= close:
            return {}
        goal = now - min(block, now - target)
        sizes = width_sizes(model, grouped)
        thresholds = sorted({k / n for n in original for k in range(1, n + 1)})
        fraction = next((f for f in thresholds
                         if f > width["fraction"] and now - width_removal(sizes, original, f) <= goal), None)
        blocks = transformer_blocks(model)[1]
        options = {"L": self.layer_step} if len(blocks) > 2 and count_parameters(blocks[-3]) <= now - target else {}
        if fraction is not None:
            width["next"] = fraction
            options["G"] = lambda m: prune_width(m, amp_scores(m, batches, self.average),
                                                 *(kept(n, fraction) for n in original), grouped)
        return options

    @staticmethod
    def layer_step(model: torch.nn.Module) -> None:
        remove_layers(model, {len(transformer_blocks(model)[1]) - 3})
