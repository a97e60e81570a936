"""The shared-prefix scorer equals the plain one-sequence-per-choice computation (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch

from prunebench.evaluation.encoding import encode_pair, model_input
from prunebench.evaluation.loglik import common_prefix_len, score_choices
from prunebench.models.tiny import load_tiny

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256,
          "sliding_window": 8, "final_logit_softcapping": 30.0, "layer_types": None}

REQUESTS = [
    ("Question: How many legs do horses have?\nAnswer:", [" two", " four", " six legs in total"]),
    ("The trophy doesn't fit because the", [" trophy is too big.", " suitcase is too small."]),
    ("Answer: ", ["Paris", "London"]),
    ("A", [" B"]),
]


def reference(model, seq: list[int], clen: int, cont: list[int]) -> tuple[float, bool]:
    """The plain computation: the whole sequence through the model, full log-softmax."""
    logits = model(torch.tensor([seq])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)[len(seq) - clen:]
    target = torch.tensor(cont)
    return float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


@pytest.mark.parametrize("config", [LLAMA, GEMMA3], ids=["llama", "gemma3"])
@pytest.mark.parametrize("max_length", [256, 12])
def test_shared_prefix_scores_equal_per_choice_reference(config, max_length):
    loaded = load_tiny(name="t", config=config, seed=1)
    for context, continuations in REQUESTS:
        inputs, lens, conts = [], [], []
        for continuation in continuations:
            ctx, cont = encode_pair(loaded.tokenizer, context, continuation)
            seq, clen = model_input(ctx, cont, max_length)
            inputs.append(seq)
            lens.append(clen)
            conts.append(cont[-clen:])
        got = score_choices(loaded.model, inputs, lens, conts)
        with torch.no_grad():
            want = [reference(loaded.model, s, n, c) for s, n, c in zip(inputs, lens, conts)]
        for (g_ll, g_greedy), (w_ll, w_greedy) in zip(got, want):
            assert g_ll == pytest.approx(w_ll, abs=1e-4)
            assert g_greedy == w_greedy


def test_common_prefix_len():
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[5], [6]]) == 0
