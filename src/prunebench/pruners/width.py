"""Width pruning, MoP's G step: the same fraction of every layer's attention heads and MLP neurons
removed, chosen by activation magnitude ("AMP"): a neuron by its mean |activation| at the down
projection's input, a head by the mean L1 norm of its contribution to the output projection.
Sparsity is that fraction of heads and of neurons; the parameter ratio is logged beside it."""

from __future__ import annotations

import math
from contextlib import ExitStack

import torch
from torch import nn

from prunebench.models.attention import Heads, attention_heads, sync_config
from prunebench.models.introspection import tower_config, tower_modules
from prunebench.models.loaded import LoadedModel
from prunebench.models.narrow import keep_neurons
from prunebench.pruners.structured import StructuredPruner, calibration_batches, observe

# how calibration statistics are averaged: over all tokens, or per batch (MoP's released prompts)
AVERAGES = ("token", "batch")


def mlp_modules(model: nn.Module) -> list[nn.Module]:
    """Gated (gate/up/down, Llama-style) and plain (up/down) MLPs of the language tower, in forward order."""
    (_, root), = tower_modules(model, "language")
    found = [m for m in root.modules() if isinstance(getattr(m, "up_proj", None), nn.Linear)
             and isinstance(getattr(m, "down_proj", None), nn.Linear)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no up_proj/down_proj MLP that width pruning supports")
    return found


@torch.no_grad()
def amp_scores(model: nn.Module, batches: list[dict], average: str = "token") -> dict[str, list[torch.Tensor]]:
    """Mean over calibration tokens of each head's |o_proj contribution|_1 and each neuron's |activation|.
    `average="batch"`: the mean of each batch's own token mean, as MoP's released code averages its
    prompts (one per batch), so a long prompt weighs no more than a short one."""
    if average not in AVERAGES:
        raise ValueError(f"average={average!r}; valid: {AVERAGES}")
    heads, mlps = attention_heads(model), mlp_modules(model)
    head_sum = [torch.zeros(h.n_heads) for h in heads]
    neuron_sum = [torch.zeros(m.down_proj.in_features) for m in mlps]
    weights = {}

    def heads_hook(layer: int, h: Heads, module, args):
        x = args[0].reshape(*args[0].shape[:-1], h.n_heads, h.head_dim)
        w = module.weight.reshape(module.out_features, h.n_heads, h.head_dim).to(x.dtype)
        contribution = torch.einsum("...hd,ohd->...ho", x, w).abs().sum(-1).float()
        head_sum[layer] += (contribution * weights["tokens"][..., None]).reshape(-1, h.n_heads).sum(0).cpu()

    def neurons_hook(layer: int, module, args):
        act = args[0].abs().float() * weights["tokens"][..., None]
        neuron_sum[layer] += act.reshape(-1, act.shape[-1]).sum(0).cpu()

    # average="batch" folds each batch's mean into `means` and counts the batch as one
    means, count = [torch.zeros_like(s) for s in head_sum + neuron_sum], 0.0
    with ExitStack() as stack:
        for layer, h in enumerate(heads):
            hook = h.out_proj.register_forward_pre_hook(
                lambda mod, args, layer=layer, h=h: heads_hook(layer, h, mod, args))
            stack.callback(hook.remove)
        for layer, m in enumerate(mlps):
            hook = m.down_proj.register_forward_pre_hook(lambda mod, args, layer=layer: neurons_hook(layer, mod, args))
            stack.callback(hook.remove)
        for batch in batches:
            mask = batch.get("attention_mask")
            weights["tokens"] = (mask if mask is not None else torch.ones_like(batch["input_ids"])).float()
            observe(model, batch)
            tokens = float(weights["tokens"].sum())
            if average == "batch":
                for mean, part in zip(means, head_sum + neuron_sum):
                    mean += part / tokens
                    part.zero_()
            count += 1.0 if average == "batch" else tokens
    sums = means if average == "batch" else head_sum + neuron_sum
    return {"heads": [s / count for s in sums[:len(heads)]], "neurons": [s / count for s in sums[len(heads):]]}


def width_of(model: nn.Module) -> tuple[int, int, bool]:
    """(head unit, neurons, grouped) of the first layer. Under grouped-query attention the head
    unit is a key/value group's query heads: the same number leaves every group, so no key/value
    head is orphaned, no inert slot is needed and every layer keeps one shape that the config can
    state. Otherwise it is the layer's heads."""
    h, mlp = attention_heads(model)[0], mlp_modules(model)[0]
    grouped = h.n_kv_heads < h.n_heads
    return (h.n_heads // h.n_kv_heads if grouped else h.n_heads), mlp.down_proj.in_features, grouped


def prune_width(model: nn.Module, scores: dict[str, list[torch.Tensor]], heads_kept: int, neurons_kept: int,
                grouped: bool) -> None:
    """Keep, in every layer, the `heads_kept` highest-scoring heads (of each key/value group when
    `grouped`) and the `neurons_kept` highest-scoring MLP neurons."""
    heads, mlps = attention_heads(model), mlp_modules(model)
    if len(heads) != len(mlps):
        raise ValueError(f"{len(heads)} attention modules but {len(mlps)} MLPs: "
                         f"width pruning needs one of each per layer")
    for h, score in zip(heads, scores["heads"]):
        size = h.n_heads // h.n_kv_heads if grouped else h.n_heads
        pruned = set()
        for first in range(0, h.n_heads, size):
            ranked = first + torch.argsort(score[first:first + size], descending=True, stable=True)
            pruned.update(ranked[heads_kept:].tolist())
        h.remove(pruned)
    for mlp, score in zip(mlps, scores["neurons"]):
        keep_neurons(mlp, torch.argsort(score, descending=True, stable=True)[:neurons_kept].sort().values)
    sync_config(model, heads)
    sync_intermediate(model, mlps)


def sync_intermediate(model: nn.Module, mlps: list[nn.Module]) -> None:
    """The MLP width into the config when every layer keeps the same one (uneven widths are padded
    at export, export/folder.py)."""
    sizes = {m.down_proj.in_features for m in mlps}
    config = tower_config(model, "language")
    if config is not None and len(sizes) == 1 and hasattr(config, "intermediate_size"):
        config.intermediate_size = sizes.pop()


def kept(n: int, fraction: float) -> int:
    return n - math.floor(n * fraction + 1e-9)


class WidthPruner(StructuredPruner):
    """`width_amp`: sparsity = fraction of every layer's heads (of every key/value group's query
    heads under GQA) and MLP neurons removed, rounded down. `sparsity/actual` is the neurons'
    achieved fraction, `sparsity/heads` the heads' (coarser: a layer has few heads)."""

    families = frozenset({"causal_lm", "vlm"})  # a vision-language model's language tower
    needs_calibration = True

    def __init__(self, name: str = "width_amp", batch_size: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        self.batch_size = batch_size

    def score(self, loaded: LoadedModel, calib=None):
        return amp_scores(loaded.model, calibration_batches(loaded, calib, self.batch_size))

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        unit, neurons, grouped = width_of(loaded.model)
        heads_before = sum(h.n_heads for h in attention_heads(loaded.model))
        prune_width(loaded.model, scores, kept(unit, sparsity), kept(neurons, sparsity), grouped)
        heads_after = sum(h.n_heads for h in attention_heads(loaded.model))
        return {"sparsity/actual": 1 - kept(neurons, sparsity) / neurons,
                "sparsity/heads": 1 - heads_after / heads_before}
