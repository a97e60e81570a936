"""Magnitude pruning against a reference written from the formula."""

import pytest
import torch

from prunebench.models.tiny import load_tiny
from prunebench.pruners.unstructured import MagnitudePruner

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.9])
def test_per_layer_masks_match_reference_and_leave_embeddings_alone(sparsity):
    loaded = load_tiny(name="t", config=CONFIG, seed=3)
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    stats = MagnitudePruner().apply(loaded, None, sparsity)
    pruned_names = set()
    for name, param in loaded.model.named_parameters():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            pruned_names.add(name)
            w = before[name]
            k = int(w.numel() * sparsity)
            threshold = torch.sort(w.abs().flatten())[0][k]  # Wanda's prune_magnitude; random floats: no ties
            expected = torch.where(w.abs() <= threshold, torch.zeros_like(w), w)
            assert torch.equal(param, expected), name
            assert int((param == 0).sum()) == k + 1
        else:
            assert torch.equal(param, before[name]), f"{name} must not be pruned"
    assert len(pruned_names) == 2 * 7
    assert stats["sparsity/actual"] == pytest.approx(sparsity, abs=1e-3)


def test_skip_layers():
    loaded = load_tiny(name="t", config=CONFIG, seed=3)
    MagnitudePruner(skip_layers=[0]).apply(loaded, None, 0.5)
    assert int((loaded.model.model.layers[0].mlp.up_proj.weight == 0).sum()) == 0
    assert int((loaded.model.model.layers[1].mlp.up_proj.weight == 0).sum()) == 64 * 128 // 2 + 1  # released rule
