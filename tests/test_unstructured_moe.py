"""Unstructured pruning reaches every routed expert's matrices (fused 3-D parameters in
transformers 5), and Wanda and SparseGPT see each expert's own routed tokens."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_cfg
from prunebench.models.cache import get_model
from prunebench.pruners.activations import input_square_sums
from prunebench.models.experts import expert_matrices, fused_experts
from prunebench.pruners.matrices import eager_experts, input_hooks
from prunebench.pruners.unstructured import MagnitudePruner, RandomPruner, SparseGPTPruner, WandaPruner
from helpers.unstructured import calib

FAMILIES = ["tiny-mixtral", "tiny-olmoe", "tiny-qwen2-moe", "tiny-qwen3-moe"]
pytestmark = pytest.mark.usefixtures("one_thread")


def moe(name):
    return get_model(compose_cfg([f"model={name}"]).model)


def expert_params(model):
    return [p for m in model.modules() for p in fused_experts(m).values()]


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("make", [lambda: MagnitudePruner(mask_rule="exact"), lambda: RandomPruner(seed=1, mask_rule="exact")],
                         ids=["magnitude", "random"])
def test_every_expert_matrix_reaches_the_target_and_is_counted(name, make):
    loaded = moe(name)
    experts = expert_params(loaded.model)
    assert experts, "the tiny MoE models store their experts fused"
    stats = make().apply(loaded, None, 0.5)
    zeros = sum(int((p == 0).sum()) for p in experts)
    assert zeros / sum(p.numel() for p in experts) == 0.5
    for p in experts:  # per expert, per matrix: layer scope compares within one expert's matrix
        assert all(float((p[e] == 0).float().mean()) == 0.5 for e in range(p.shape[0]))
    assert stats["sparsity/actual"] == pytest.approx(0.5, abs=1e-3)


def halves(p, e):
    """Expert e's gate and up matrices of a fused [gate; up] parameter, as the unfused layout has them."""
    return p[e].chunk(2, dim=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_gate_and_up_are_each_pruned_as_their_own_matrix(name):
    """Each half follows the released rule on its own |W|, so each loses int(n * s) + 1 weights;
    pruned as one matrix, the halves landed anywhere in 47.9-52.1%."""
    loaded = moe(name)
    fused = [m.gate_up_proj for m in loaded.model.modules() if "gate_up_proj" in fused_experts(m)]
    before = [p.detach().clone() for p in fused]
    MagnitudePruner().apply(loaded, None, 0.5)
    for p, old in zip(fused, before):
        for e in range(p.shape[0]):
            for half, was in zip(halves(p, e), halves(old, e)):
                threshold = torch.sort(was.abs().flatten())[0][int(was.numel() * 0.5)]  # prune_magnitude
                assert torch.equal(half == 0, was.abs() <= threshold)


@pytest.mark.parametrize("make", [lambda: MagnitudePruner(mask_rule="exact"), lambda: RandomPruner(seed=1, mask_rule="exact"),
                                  lambda: SparseGPTPruner(mask_rule="exact")], ids=["magnitude", "random", "sparsegpt"])
def test_under_the_exact_rule_gate_and_up_each_lose_exactly_half(make):
    loaded = moe("tiny-mixtral")  # 64 inputs < block_size: one SparseGPT block a half, so exact per half
    pruner = make()
    pruner.apply(loaded, pruner.score(loaded, calib(n_samples=2, seq_len=16)), 0.5)
    for m in loaded.model.modules():
        if "gate_up_proj" in fused_experts(m):
            p = m.gate_up_proj
            assert all(float((half == 0).float().mean()) == 0.5 for e in range(p.shape[0]) for half in halves(p, e))


@pytest.mark.parametrize("make", [MagnitudePruner, WandaPruner, SparseGPTPruner])
def test_the_shared_expert_gate_stays_dense_like_the_routers(make):
    """Qwen2-MoE gates its shared expert with a Linear (hidden -> 1): a router, so not pruned."""
    loaded = moe("tiny-qwen2-moe")
    gates = {n: m.weight.detach().clone() for n, m in loaded.model.named_modules() if n.endswith("shared_expert_gate")}
    assert gates
    pruner = make()
    pruner.apply(loaded, pruner.score(loaded, calib(n_samples=2, seq_len=16)), 0.5)
    assert not any(n.endswith("shared_expert_gate") for n in pruner.targets(loaded.model))
    modules = dict(loaded.model.named_modules())
    assert all(torch.equal(modules[n].weight, w) for n, w in gates.items())


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-olmoe"])
def test_wanda_sees_only_the_tokens_routed_to_each_expert(name):
    loaded = moe(name)
    pruner = WandaPruner()
    samples = calib(n_samples=2, seq_len=16).samples(loaded.tokenizer)
    targets = pruner.targets(loaded.model)
    counts = {}

    def count(name_, x):
        counts[name_] = counts.get(name_, 0) + x.shape[0]

    with eager_experts(loaded.model), input_hooks(targets, count), torch.no_grad():
        for row in samples:
            loaded.model(row[None])
    k, tokens = loaded.model.config.num_experts_per_tok, samples.numel()
    for layer in range(loaded.model.config.num_hidden_layers):
        routed = [n for n in counts if f"layers.{layer}.mlp.experts.gate_up_proj." in n and n.endswith(".gate")]
        assert sum(counts[n] for n in routed) == k * tokens  # each token reaches k experts, no more
        assert all(counts[n[:-len("gate")] + "up"] == counts[n] for n in routed)  # up sees gate's inputs
        down = [n for n in counts if f"layers.{layer}.mlp.experts.down_proj." in n]
        assert sorted(counts[n] for n in down) == sorted(counts[n] for n in routed)
    sums = input_square_sums(loaded.model, targets, [{"input_ids": row[None]} for row in samples])
    assert set(sums) == set(targets)


@pytest.mark.parametrize("make", [WandaPruner, SparseGPTPruner])
def test_calibrated_pruners_reach_the_target_on_every_expert(make):
    loaded = moe("tiny-mixtral")
    pruner = make()
    c = calib(n_samples=2, seq_len=16)
    stats = pruner.apply(loaded, pruner.score(loaded, c), 0.5)
    experts = expert_params(loaded.model)
    zeros = sum(int((p == 0).sum()) for p in experts)
    # Wanda: per output row; SparseGPT: per block of 128 columns, so per matrix within rounding
    assert zeros / sum(p.numel() for p in experts) == pytest.approx(0.5, abs=0.01)
    assert stats["sparsity/actual"] == pytest.approx(0.5, abs=0.01)
    out = loaded.model(c.samples(loaded.tokenizer)[:1]).logits
    assert torch.isfinite(out).all()


def test_interleaved_gate_up_rows_alternate():
    """transformers' experts decorator also stores gate/up interleaved ([gate0, up0, gate1, ...])
    when `is_concatenated` is False: the halves are then every other row."""
    module = torch.nn.Module()
    module.has_gate, module.is_concatenated = True, False
    rows = torch.arange(6)
    parts = expert_matrices(module, "gate_up_proj", 6)
    assert rows[parts[".gate"]].tolist() == [0, 2, 4] and rows[parts[".up"]].tolist() == [1, 3, 5]
    assert expert_matrices(module, "down_proj", 6) == {"": slice(None)}
