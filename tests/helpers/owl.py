"""OWL's released computations written step by step (outlier ratios, layer sparsities) and a tiny
model with outliers: the reference side of the OWL and Wanda release tests."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from helpers.unstructured import CONFIG
from prunebench.models.tiny import load_tiny

LAYERS = 4


def tiny_with_outliers():
    """Four blocks, two of them fed a few massive activation channels (the outliers OWL keys on, as
    LLMs have them): their outlier ratios then differ from the others' by more than chance."""
    loaded = load_tiny(name="t", config={**CONFIG, "num_hidden_layers": LAYERS}, seed=3)
    with torch.no_grad():
        for index, gain in ((1, 30.0), (3, 8.0)):
            loaded.model.model.layers[index].post_attention_layernorm.weight[:3] *= gain
    return loaded


def add_batch(state: dict, module, args, out) -> None:
    """WrappedGPT.add_batch: a running mean over samples of each input feature's squared norm, float32."""
    inp = args[0]
    if inp.dim() == 2:
        inp = inp.unsqueeze(0)
    count = inp.shape[0]
    inp = inp.reshape(-1, inp.shape[-1]).t()
    state["scaler_row"] *= state["nsamples"] / (state["nsamples"] + count)
    state["nsamples"] += count
    state["scaler_row"] += torch.norm(inp.type(torch.float32), p=2, dim=1) ** 2 / state["nsamples"]


@torch.no_grad()
def released_outlier_ratios(model, samples: torch.Tensor, hyper_m: float) -> list[float]:
    """The outlier pass: every nn.Linear of each decoder layer (find_layers), its inputs measured
    sample by sample on the dense model (the pass prunes nothing, so the layer-by-layer replay equals
    one forward of the whole model); per layer, the Wanda metrics of all its Linears flattened and
    concatenated, and the percent above Hyper_m x their mean (check_outlier_mean)."""
    wrapped, hooks = [], []
    for layer in model.model.layers:
        subset = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        states = {n: {"scaler_row": torch.zeros(m.in_features), "nsamples": 0} for n, m in subset.items()}
        hooks += [m.register_forward_hook(partial(add_batch, states[n])) for n, m in subset.items()]
        wrapped.append((subset, states))
    for row in samples:
        model(row[None])
    for hook in hooks:
        hook.remove()
    ratios = []
    for subset, states in wrapped:
        layer_wmetric = torch.cat([torch.flatten(torch.abs(subset[n].weight.data)
                                                 * torch.sqrt(states[n]["scaler_row"].reshape((1, -1))))
                                   for n in subset])
        threshold = torch.mean(layer_wmetric) * hyper_m
        ratios.append(float((layer_wmetric > threshold).sum().item()) / layer_wmetric.numel() * 100)
    return ratios


def released_layer_sparsities(ratios: list[float], sparsity: float, lamda: float) -> list[float]:
    """all_layer_ratio scaled to [0, 2 x Lamda], shifted to mean 1 - sparsity (a density), then each
    layer's sparsity 1 - density, 0.01 where that is not positive."""
    all_layer_ratio = np.array(ratios)
    all_layer_ratio = ((all_layer_ratio - all_layer_ratio.min())
                       * (1 / (all_layer_ratio.max() - all_layer_ratio.min()) * lamda * 2))
    all_layer_ratio = all_layer_ratio - np.mean(all_layer_ratio) + (1 - sparsity)
    out = []
    for i in range(len(all_layer_ratio)):
        layer_sparsity_ratio = 1 - all_layer_ratio[i]
        if layer_sparsity_ratio <= 0:
            layer_sparsity_ratio = 0.01
        out.append(layer_sparsity_ratio)
    return out

