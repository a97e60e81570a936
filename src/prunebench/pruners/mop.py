"""MoP (Mixture of Pruners, Yamamoto et al.): depth and width steps mixed to a compression ratio.

Sparsity is the fraction of the transformer blocks' parameters removed (embeddings and the LM
head are never pruned; on Gemma 3 270M they are 63% of the model, so a ratio of the whole model
would mean little). Each step removes about one original block's worth of parameters:
- L: delete the block at index len - 3 (the released code's choice; the last two always stay);
- G: raise the width fraction F removed from every layer's heads and MLP neurons (relative to
  the original widths), re-scoring the current model by activation magnitude, until the step's
  parameters are gone.
The last step removes only what is left to reach the ratio, and is G when a whole block would
overshoot. The L/G choice is a seeded random sequence (as the released code's pre-generated
sequences) or, with `selector: perplexity`, whichever candidate gives the lower calibration
perplexity. The sequence taken is logged (tag `mop/sequence`)."""

from __future__ import annotations

import copy
import math
import random

import torch

from prunebench.models.attention import attention_heads
from prunebench.models.introspection import count_parameters, transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.layers import remove_layers
from prunebench.pruners.structured import StructuredPruner, calibration_batches, model_loss
from prunebench.pruners.width import IN_PROJS, amp_scores, kept, mlp_modules, prune_width, width_of

SELECTORS = ("random", "perplexity")


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


class MoPPruner(StructuredPruner):
    families = frozenset({"causal_lm"})
    needs_calibration = True
    cacheable = False  # every G step re-scores the model as it is by then

    def __init__(self, name: str = "mop", selector: str = "random", seed: int = 0, batch_size: int = 1):
        super().__init__(name)
        if selector not in SELECTORS:
            raise ValueError(f"pruner {name}: selector={selector!r}; valid: {SELECTORS}")
        self.selector, self.seed, self.batch_size = selector, seed, batch_size

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, list[dict]]:
        """MoP's importance is recomputed at every step, so scoring only fixes the calibration batches."""
        return {"batches": calibration_batches(loaded, calib, self.batch_size)}

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        batches = scores["batches"]
        start = block_params(loaded.model)
        step = start / len(transformer_blocks(loaded.model)[1])
        target = start * (1 - sparsity)
        *original, grouped = width_of(loaded.model)
        thresholds = sorted({k / n for n in original for k in range(1, n + 1)})
        rng = random.Random(self.seed)
        fraction, sequence = 0.0, ""
        while (now := block_params(loaded.model)) - target > min(start / 1e4, step / 100):
            blocks = transformer_blocks(loaded.model)[1]
            sizes = width_sizes(loaded.model, grouped)
            goal = now - min(step, now - target)
            width = next((f for f in thresholds
                          if f > fraction and now - width_removal(sizes, original, f) <= goal), None)
            options = [c for c, ok in (("L", len(blocks) > 2 and count_parameters(blocks[-3]) <= now - target),
                                       ("G", width is not None)) if ok]
            if not options:
                break
            if self.selector == "random":
                drawn = rng.choice("LG")
                choice = drawn if drawn in options else options[0]
                self.step(loaded.model, choice, original, grouped, width, batches)
            else:
                trials = {c: self.step(copy.deepcopy(loaded.model), c, original, grouped, width, batches)
                          for c in options}
                choice = min(trials, key=lambda c: perplexity(trials[c], batches))
                loaded.model = trials[choice]
            fraction = width if choice == "G" else fraction
            sequence += choice
        return {"sparsity/actual": 1 - block_params(loaded.model) / start, "mop/sequence": sequence,
                "mop/width_fraction": fraction, "mop/layers_removed": float(sequence.count("L"))}

    @staticmethod
    def step(model: torch.nn.Module, choice: str, original: list[int], grouped: bool, width: float | None,
             batches: list[dict]) -> torch.nn.Module:
        if choice == "L":
            remove_layers(model, {len(transformer_blocks(model)[1]) - 3})
        else:
            units, neurons = (kept(n, width) for n in original)
            prune_width(model, amp_scores(model, batches), units, neurons, grouped)
        return model
