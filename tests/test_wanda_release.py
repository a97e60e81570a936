"""Wanda in the released order against a reference written here step by step from the released code
(locuslab/wanda lib/prune.py `prune_wanda` and `prepare_calibration_input`, lib/layerwrapper.py
`WrappedGPT.add_batch`; luuyin/OWL lib/prune_all.py `prune_wanda_outlier`, whose pruning pass is the
same loop at each layer's own ratio): each layer's inputs measured on the outputs of the layers
before it, already pruned, and recomputed through the layer once it is pruned.

Tolerance: 0 mask mismatches. Both sides form the score in float32 from the same weights; the norms
differ by a few float32 ulps (the reference's running mean against our float64 sum / samples), which
could flip only a pair of scores in one row within ~1e-6 of each other, and random float weights put
none that close at these sizes (the test would show it)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from conftest import compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.models.tiny import load_tiny
from prunebench.pruners.dsnot import DSnoTPruner
from prunebench.pruners.owl import OWLPruner
from prunebench.pruners.score_cache import cached_scores
from prunebench.pruners.unstructured import WandaPruner
from prunebench.validate import validate
from test_owl import add_batch, released_layer_sparsities, released_outlier_ratios, tiny_with_outliers
from test_unstructured import CONFIG, calib, weights

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = 4


def tiny():
    return load_tiny(name="t", config={**CONFIG, "num_hidden_layers": LAYERS}, seed=3)


def first(out):
    """A decoder layer's hidden state: the release's `layer(...)[0]` of the tuple older transformers return."""
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def released_prune_wanda(model, samples: torch.Tensor, ratios: list[float]) -> None:
    """prune_wanda with layer i pruned at ratios[i] (OWL's layer_sparsity_ratio; Wanda's one ratio
    for all), step by step."""
    layers = model.model.layers
    inps, cache = [], {}

    class Catcher(torch.nn.Module):
        """prepare_calibration_input: layer 0's input per sample and the keyword arguments it gets."""

        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, inp, **kwargs):
            inps.append(inp)
            cache.update(kwargs)
            raise ValueError

    layers[0] = Catcher(layers[0])
    for row in samples:
        try:
            model(row[None], use_cache=False)
        except ValueError:
            pass
    layers[0] = layers[0].module
    for layer, ratio in zip(layers, ratios):
        subset = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}  # find_layers
        wrapped = {n: {"scaler_row": torch.zeros(m.in_features), "nsamples": 0} for n, m in subset.items()}
        handles = [m.register_forward_hook(partial(add_batch, wrapped[n])) for n, m in subset.items()]
        outs = [first(layer(inp, **cache)) for inp in inps]
        for h in handles:
            h.remove()
        for name in subset:
            w_metric = torch.abs(subset[name].weight.data) * torch.sqrt(wrapped[name]["scaler_row"].reshape((1, -1)))
            w_mask = torch.zeros_like(w_metric) == 1
            sort_res = torch.sort(w_metric, dim=-1, stable=True)
            indices = sort_res[1][:, :int(w_metric.shape[1] * ratio)]
            w_mask.scatter_(1, indices, True)
            subset[name].weight.data[w_mask] = 0
        outs = [first(layer(inp, **cache)) for inp in inps]  # through the layer just pruned
        inps = outs


def mismatches(a, b, blocks=range(LAYERS)) -> int:
    wa, wb = weights(a.model), weights(b.model)
    return sum(int(((wa[n] == 0) != (wb[n] == 0)).sum()) for n in wa if int(n.split(".")[2]) in blocks)


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_sequential_wanda_equals_the_release(sparsity):
    ours, reference = tiny(), tiny()
    cal = calib()
    pruner = WandaPruner()  # sequential, the default
    assert pruner.sequential and not pruner.cacheable
    pruner.apply(ours, pruner.score(ours, cal), sparsity)
    released_prune_wanda(reference.model, cal.samples(reference.tokenizer), [sparsity] * LAYERS)
    assert mismatches(ours, reference) == 0
    # the dense-norm variant: the same masks in block 0 (the same inputs), others after it
    dense = tiny()
    variant = WandaPruner(sequential=False)
    variant.apply(dense, variant.score(dense, cal), sparsity)
    assert mismatches(dense, reference, [0]) == 0
    assert mismatches(dense, reference, range(1, LAYERS)) > 0


def test_owl_wanda_prunes_through_the_pruned_blocks_at_its_released_ratios():
    """prune_wanda_outlier: the outlier pass on the dense model, then the pruning pass above."""
    ours, reference = tiny_with_outliers(), tiny_with_outliers()
    cal = calib()
    samples = cal.samples(reference.tokenizer)
    ratios = released_layer_sparsities(released_outlier_ratios(reference.model, samples, 5), 0.6, 0.08)
    released_prune_wanda(reference.model, samples, ratios)
    pruner = OWLPruner()
    stats = pruner.apply(ours, pruner.score(ours, cal), 0.6)
    assert mismatches(ours, reference) == 0
    assert max(ratios) - min(ratios) > 0.05 and np.mean(ratios) == pytest.approx(0.6, abs=1e-12)
    dense = tiny_with_outliers()
    variant = OWLPruner(sequential=False)
    assert variant.apply(dense, variant.score(dense, cal), 0.6) == stats  # same counts per block
    assert mismatches(dense, reference) > 0


@pytest.mark.parametrize("sequential", [True, False])
def test_dsnot_unrepaired_is_wanda_in_the_same_order(sequential):
    """DSnoT's initial mask with max_cycles 0 (the release's --without_DSnoT) is Wanda's, measured the
    same way: through the pruned blocks, or every block on the dense model."""
    cal = calib()
    wanda, dsnot = tiny(), tiny()
    pruner = WandaPruner(sequential=sequential)
    pruner.apply(wanda, pruner.score(wanda, cal), 0.6)
    unrepaired = DSnoTPruner(max_cycles=0, sequential=sequential)
    unrepaired.apply(dsnot, unrepaired.score(dsnot, cal), 0.6)
    assert mismatches(wanda, dsnot) == 0


def test_sequential_scores_are_never_cached_nor_shared_across_sparsities(tmp_path, monkeypatch):
    """Sequential norms hang on the sparsity, so the score cache stores nothing for them: each job
    runs the whole pass, where the dense-norm variant's one scoring serves every ratio."""
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path))
    loaded, cal = tiny(), calib(n_samples=2)
    key = {"test": "wanda"}
    windows, hit = cached_scores(WandaPruner(), loaded, cal, key)
    assert not hit and isinstance(windows, list) and not any(tmp_path.rglob("*.json"))
    cached_scores(WandaPruner(sequential=False), loaded, cal, key)
    assert cached_scores(WandaPruner(sequential=False), loaded, cal, key)[1]


@pytest.mark.parametrize("overrides, match", [
    (["pruner=wanda", "pruner.scope=global"], "scope=global.*sequential=false"),
    (["pruner=wanda", "pruner.sequential=maybe"], "sequential='maybe'.*true.*false"),
    (["pruner=owl_sparsegpt", "pruner.sequential=false"], "sequential=False.*base='sparsegpt'"),
    (["pruner=owl", "+pruner.base_options.sequential=false"], "sequential"),
    (["pruner=dsnot", "pruner.sequential=1"], "sequential=1"),
])
def test_bad_sequential_settings_are_refused_before_the_model_loads(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose_cfg(["model=tiny-llama", *overrides, "sparsity=0.5"]))
    assert not WandaPruner(scope="global", sequential=False).sequential  # global ranks the dense norms
