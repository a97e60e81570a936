"""Unstructured pruning reaches every routed expert's matrices (fused 3-D parameters in
transformers 5), and Wanda and SparseGPT see each expert's own routed tokens."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_cfg
from prunebench.models.cache import get_model
from prunebench.pruners.activations import input_square_sums
from prunebench.models.experts import fused_experts
from prunebench.pruners.matrices import eager_experts, input_hooks
from prunebench.pruners.unstructured import MagnitudePruner, RandomPruner, SparseGPTPruner, WandaPruner
from test_unstructured import calib

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
        routed = [n for n in counts if f"layers.{layer}.mlp.experts.gate_up_proj." in n]
        assert sum(counts[n] for n in routed) == k * tokens  # each token reaches k experts, no more
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
