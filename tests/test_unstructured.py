"""Magnitude, random, Wanda and SparseGPT against references written here from their formulas."""

from __future__ import annotations


import pytest
import torch

from prunebench.models.tiny import load_tiny
from prunebench.pruners.masks import lowest, parse_pattern
from prunebench.pruners.unstructured import MagnitudePruner, RandomPruner, SparseGPTPruner, WandaPruner
from helpers.unstructured import CONFIG, calib, linears, weights





pytestmark = pytest.mark.usefixtures("one_thread")




def tiny():
    return load_tiny(name="t", config=CONFIG, seed=3)






def reference_inputs(model, samples):
    """Every projection's inputs over the calibration windows, collected with plain forward hooks."""
    seen = {name: [] for name in linears(model)}
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen[name].append(args[0].reshape(-1, args[0].shape[-1])))
             for name, m in linears(model).items()]
    with torch.no_grad():
        for row in samples:
            model(row[None])
    for h in hooks:
        h.remove()
    return {name: torch.cat(xs) for name, xs in seen.items()}


@pytest.mark.parametrize("rule, extra", [("released", 1), ("exact", 0)])
def test_global_scope_prunes_the_lowest_magnitudes_of_all_layers_together(rule, extra):
    loaded = tiny()
    before = weights(loaded.model)
    stats = MagnitudePruner(scope="global", mask_rule=rule).apply(loaded, None, 0.6)
    everything = torch.cat([w.abs().flatten() for w in before.values()])
    k = int(everything.numel() * 0.6) + extra  # released: |W| <= sort(|W|)[int(n*s)], one more
    threshold = everything.sort().values[k - 1]  # random floats: no ties
    for name, w in weights(loaded.model).items():
        assert torch.equal(w, torch.where(before[name].abs() <= threshold, 0.0, before[name])), name
    zeros = sum(int((w == 0).sum()) for w in weights(loaded.model).values())
    assert zeros == k
    assert stats["sparsity/actual"] == k / everything.numel()
    per_layer = [float((w == 0).float().mean()) for w in weights(loaded.model).values()]
    assert max(per_layer) - min(per_layer) > 0.01  # global: layers end up unequal


@pytest.mark.parametrize("scope", ["layer", "global", "row"])
@pytest.mark.parametrize("sparsity", [0.1, 0.37, 0.5])
def test_achieved_sparsity_is_exact_under_the_exact_rule(scope, sparsity):
    loaded = tiny()
    stats = MagnitudePruner(scope=scope, mask_rule="exact").apply(loaded, None, sparsity)
    ws = weights(loaded.model)
    if scope == "layer":
        expected = sum(int(w.numel() * sparsity) for w in ws.values())
    elif scope == "row":
        expected = sum(w.shape[0] * int(w.shape[1] * sparsity) for w in ws.values())
    else:
        expected = int(sum(w.numel() for w in ws.values()) * sparsity)
    assert sum(int((w == 0).sum()) for w in ws.values()) == expected
    assert stats["sparsity/actual"] == expected / sum(w.numel() for w in ws.values())


def test_ties_are_broken_by_position_so_the_count_stays_exact():
    scores = [torch.tensor([[1.0, 0.0, 1.0], [1.0, 2.0, 1.0]]), torch.tensor([1.0, 0.5])]
    layer, vector = lowest(scores, 0.5, "exact")
    assert layer.tolist() == [[True, True, True], [False, False, False]]
    assert vector.tolist() == [False, True]


def test_released_rule_prunes_every_score_at_or_below_sort_at_int_n_s():
    """Hand-computed from Wanda's prune_magnitude, |W| <= sort(|W|)[int(n * s)]: n = 8, s = 0.5,
    sort = [.1 .2 .3 .4 .5 .7 .8 .9], threshold sort[4] = .5, so five weights go (exact: four)."""
    score = torch.tensor([[0.5, 0.1, 0.9, 0.3], [0.7, 0.2, 0.8, 0.4]])
    assert lowest([score], 0.5, "released")[0].tolist() == [[True, True, False, True], [False, True, False, True]]
    assert lowest([score], 0.5, "exact")[0].tolist() == [[False, True, False, True], [False, True, False, True]]
    # ties at the threshold all go: sort = [0 1 1 1 1 2], int(6 * 0.5) = 3, sort[3] = 1
    tied = torch.tensor([1.0, 0.0, 1.0, 2.0, 1.0, 1.0])
    assert lowest([tied], 0.5, "released")[0].tolist() == [True, True, True, False, True, True]
    assert lowest([tied], 0.5, "exact")[0].tolist() == [True, True, True, False, False, False]
    # a small group still loses its lowest weight, as the reference's does: int(4 * 0.1) = 0, sort[0]
    assert lowest([torch.tensor([3.0, 1.0, 2.0, 4.0])], 0.1, "released")[0].tolist() == [False, True, False, False]


def test_sparsegpt_blocks_follow_the_released_rule():
    """With an identity Hessian SparseGPT makes no updates and its block mask is SparseGPT's
    `tmp <= sort(tmp)[int(n * s)]` on w^2: per 2-column block of this 2x4 weight, n = 4, int(4 x 0.5)
    = 2, so three of each block's four weights go (exact: two). Hand-computed below."""
    weight = torch.tensor([[0.3, -0.1, 0.8, 0.6], [0.2, 0.9, -0.7, 0.5]])
    expected = {"released": [[True, True, False, True], [True, False, True, True]],
                "exact": [[False, True, False, True], [True, False, False, True]]}
    for rule, zeros in expected.items():
        w = weight.clone()
        SparseGPTPruner(block_size=2, mask_rule=rule).reconstruct(w, torch.eye(4, dtype=torch.float64), 0.5)
        assert (w == 0).tolist() == zeros, rule
        assert torch.equal(w[w != 0], weight[w != 0])  # identity Hessian: the kept weights do not move


def test_an_unknown_mask_rule_is_refused():
    with pytest.raises(ValueError, match="mask_rule"):
        MagnitudePruner(mask_rule="nearest")


@pytest.mark.parametrize("sparsity", [0.3, 0.5])
def test_dense_norm_wanda_masks_equal_the_formula_on_dense_activations(sparsity):
    """sequential=false; the released order (the default) is tests/test_wanda_release.py's."""
    loaded = tiny()
    before = weights(loaded.model)
    cal = calib()
    inputs = reference_inputs(loaded.model, cal.samples(loaded.tokenizer))
    pruner = WandaPruner(sequential=False)
    pruner.apply(loaded, pruner.score(loaded, cal), sparsity)
    for name, w in weights(loaded.model).items():
        metric = before[name].abs() * inputs[name].double().norm(dim=0).float()[None, :]
        k = int(w.shape[1] * sparsity)
        pruned = torch.zeros_like(w, dtype=torch.bool)
        pruned.scatter_(1, metric.argsort(dim=1)[:, :k], True)
        assert torch.equal(w == 0, pruned), name
        assert torch.equal(w[~pruned], before[name][~pruned])


@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
@pytest.mark.parametrize("make", [MagnitudePruner, WandaPruner, SparseGPTPruner])
def test_n_m_pattern_holds_in_every_group(make, pattern):
    n, m = parse_pattern(pattern)
    loaded = tiny()
    pruner = make(pattern=pattern)
    scores = pruner.score(loaded, calib()) if pruner.needs_calibration else None
    stats = pruner.apply(loaded, scores, (m - n) / m)
    for name, w in weights(loaded.model).items():
        zeros = (w.reshape(w.shape[0], -1, m) == 0).sum(-1)
        assert torch.all(zeros == m - n), name
    assert stats["sparsity/actual"] == (m - n) / m


def test_pattern_fixes_the_sparsity_and_must_be_quoted_in_yaml():
    with pytest.raises(ValueError, match="set sparsity=0.5"):
        MagnitudePruner(pattern="2:4").check(0.3)
    MagnitudePruner(pattern="2:4").check(0.5)
    with pytest.raises(ValueError, match="quote"):
        MagnitudePruner(pattern=124)  # what YAML makes of an unquoted 2:4
    with pytest.raises(ValueError, match="N:M"):
        WandaPruner(pattern="4:2")


def reconstruction_error(w, w_pruned, x):
    return float(((x @ (w - w_pruned).T) ** 2).sum())


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_sparsegpt_reconstructs_a_layer_better_than_magnitude(sparsity):
    dense = tiny()
    before = weights(dense.model)
    cal = calib(n_samples=16)
    inputs = reference_inputs(dense.model, cal.samples(dense.tokenizer))
    by_sgpt, by_mag = tiny(), tiny()
    pruner = SparseGPTPruner()
    stats = pruner.apply(by_sgpt, pruner.score(by_sgpt, cal), sparsity)
    MagnitudePruner().apply(by_mag, None, sparsity)
    assert stats["sparsity/actual"] == pytest.approx(sparsity, abs=0.01)
    for name, w in weights(by_sgpt.model).items():
        if not name.startswith("model.layers.0."):
            continue  # later layers see inputs changed by the pruning before them
        assert float((w == 0).float().mean()) == pytest.approx(sparsity, abs=0.01)
        x = inputs[name]
        sgpt = reconstruction_error(before[name], w, x)
        mag = reconstruction_error(before[name], weights(by_mag.model)[name], x)
        assert sgpt < mag, name


def test_sparsegpt_propagates_through_the_pruned_layers():
    """Layer 1's masks differ from the ones dense-model inputs would give."""
    cal = calib(n_samples=16)
    sequential, layer1_only = tiny(), tiny()
    pruner = SparseGPTPruner()
    pruner.apply(sequential, pruner.score(sequential, cal), 0.5)
    only = SparseGPTPruner(skip_layers=[0])
    only.apply(layer1_only, only.score(layer1_only, cal), 0.5)
    name = "model.layers.1.mlp.down_proj"
    assert not torch.equal(weights(sequential.model)[name], weights(layer1_only.model)[name])


def test_same_seed_same_masks():
    def wanda_mask(seed):
        loaded = tiny()
        WandaPruner().apply(loaded, WandaPruner().score(loaded, calib(seed)), 0.5)
        return {n: w == 0 for n, w in weights(loaded.model).items()}

    def random_mask(seed):
        loaded = tiny()
        RandomPruner(seed=seed).apply(loaded, None, 0.5)
        return {n: w == 0 for n, w in weights(loaded.model).items()}

    def sparsegpt_weights(seed):
        loaded = tiny()
        SparseGPTPruner().apply(loaded, SparseGPTPruner().score(loaded, calib(seed)), 0.5)
        return weights(loaded.model)

    for make in (wanda_mask, random_mask, sparsegpt_weights):
        first, again, other = make(0), make(0), make(1)
        assert all(torch.equal(first[n], again[n]) for n in first), make.__name__
        assert not all(torch.equal(first[n], other[n]) for n in first), make.__name__


def test_modules_and_skip_layers_choose_what_is_pruned():
    loaded = tiny()
    MagnitudePruner(modules=["attention"], skip_layers=[1], mask_rule="exact").apply(loaded, None, 0.5)
    for name, w in weights(loaded.model).items():
        pruned = name.startswith("model.layers.0.self_attn.")
        assert float((w == 0).float().mean()) == (0.5 if pruned else 0.0), name
    with pytest.raises(ValueError, match="subset"):
        MagnitudePruner(modules=["heads"])
