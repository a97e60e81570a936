"""The blocked LM head (evaluation/head.py) against the plain one: the full logits' fp32
log-softmax at each target and lm-eval's greedy test (argmax == target), whatever the blocking."""

from __future__ import annotations

import pytest
import torch

from conftest import reordered
from prunebench.evaluation.head import token_logprobs
from prunebench.models.tiny import load_tiny

CONFIG = {"model_type": "gemma2", "final_logit_softcapping": 0.5, "head_dim": 8, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def loaded():
    return load_tiny(name="capped", config=CONFIG, seed=3)


@pytest.mark.parametrize("rows,vocab_block", [(None, None), (3, 7), (1, 1), (5, 10_000)])  # 10k: one block
def test_blocked_head_equals_full_log_softmax(loaded, rows, vocab_block):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 32, generator=gen)
    logits = loaded.lm_logits(hidden).float()
    greedy_tokens = logits.argmax(-1)
    entry_rows = torch.tensor([0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10])  # rows 0 and 10 serve several entries
    targets = torch.randint(0, loaded.vocab_size, (len(entry_rows),), generator=gen)
    targets[[1, 4, 13]] = greedy_tokens[entry_rows[[1, 4, 13]]]
    want = torch.log_softmax(logits, -1)[entry_rows, targets]
    got, greedy = token_logprobs(loaded, hidden, targets, entry_rows, rows=rows, vocab_block=vocab_block)
    torch.testing.assert_close(got, want, **reordered(logits, depth=1))  # log-sum-exp in another order
    assert greedy.tolist() == (greedy_tokens[entry_rows] == targets).tolist()
    assert greedy[[1, 4, 13]].all()


def test_a_tie_is_greedy_for_its_first_token_only(loaded):
    """lm-eval's argmax takes the first of equal logits; so does the blocked head across blocks."""
    hidden = torch.zeros(1, 32)  # every logit equal: soft-capped 0
    tokens = torch.tensor([0, 1, loaded.vocab_size - 1])
    for block in (7, loaded.vocab_size):  # several blocks, and one
        _, greedy = token_logprobs(loaded, hidden, tokens, torch.zeros(3, dtype=torch.long), vocab_block=block)
        assert greedy.tolist() == [True, False, False]
