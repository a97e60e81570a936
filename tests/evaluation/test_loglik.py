"""The batched shared-prefix scorer equals the plain one-sequence-per-choice computation (fp32, 1e-4)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from conftest import close_to

from prunebench.evaluation.encoding import encode_pair, model_input
from prunebench.evaluation.loglikelihood.scorer import common_prefix_len, padded_runs, score_choices, score_documents
from prunebench.models.tiny import load_tiny

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
# a sliding window shorter than the documents, so window masking across the cache is exercised
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256,
          "sliding_window": 8, "final_logit_softcapping": 30.0, "layer_types": None}

# (contexts, continuations): one context for all choices, or one per choice (WinoGrande-style)
DOCUMENTS = [
    (["Question: How many legs do horses have?\nAnswer:"], [" two", " four", " six legs in total"]),
    (["The trophy doesn't fit because the"], [" trophy is too big.", " suitcase is too small."]),
    (["Answer: "], ["Paris", "London"]),
    (["A"], [" B"]),
    (["Question: Which?\nA. x\nB. y\nAnswer:"], [" A", " B"]),  # one-token continuations: no suffix pass
    (["Tom lent his umbrella to Ben because Tom", "Tom lent his umbrella to Ben because Ben"],
     [" was going out in the rain."]),
    (["Tom got it", "Ben got it"], [" right."]),  # no shared prefix at all without BOS
]


@dataclass
class Doc:
    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]


def encode_doc(tokenizer, contexts, continuations, max_length, add_bos=None) -> Doc:
    pairs = [(c, x) for c in contexts for x in continuations]
    doc = Doc([], [], [])
    for context, continuation in pairs:
        ctx, cont = encode_pair(tokenizer, context, continuation, add_bos)
        seq, clen = model_input(ctx, cont, max_length)
        doc.inputs.append(seq), doc.cont_lens.append(clen), doc.conts.append(cont[-clen:])
    return doc


def reference(model, seq: list[int], clen: int, cont: list[int]) -> tuple[float, bool]:
    """The plain computation: the whole sequence through the model, full log-softmax."""
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)[len(seq) - clen:]
    target = torch.tensor(cont)
    return float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


def assert_equal_to_reference(model, docs: list[Doc], got):
    for doc, scores in zip(docs, got):
        want = [reference(model, s, n, c) for s, n, c in zip(doc.inputs, doc.cont_lens, doc.conts)]
        for (g_ll, g_greedy), (w_ll, w_greedy) in zip(scores, want):
            # a shared-prefix KV cache and selected LM-head rows reorder the sums, 3 layers at most
            assert g_ll == close_to(w_ll, depth=3)
            assert g_greedy == w_greedy


@pytest.mark.parametrize("config", [LLAMA, GEMMA3], ids=["llama", "gemma3"])
@pytest.mark.parametrize("max_length", [256, 12])
@pytest.mark.parametrize("add_bos", [None, False])
def test_one_batch_of_documents_equals_per_choice_reference(config, max_length, add_bos):
    loaded = load_tiny(name="t", config=config, seed=1)
    docs = [encode_doc(loaded.tokenizer, c, x, max_length, add_bos) for c, x in DOCUMENTS]
    got = score_documents(loaded, docs)
    assert [len(s) for s in got] == [len(d.inputs) for d in docs]
    assert_equal_to_reference(loaded.model, docs, got)


def test_batching_and_logit_chunks_do_not_change_scores():
    loaded = load_tiny(name="t", config=GEMMA3, seed=2)
    docs = [encode_doc(loaded.tokenizer, c, x, 256) for c, x in DOCUMENTS]
    together = score_documents(loaded, docs, rows=1, vocab_block=7)  # one LM-head row, 7 tokens at a time
    for doc, scores in zip(docs, together):
        alone = score_choices(loaded, doc.inputs, doc.cont_lens, doc.conts)
        for (a, ga), (b, gb) in zip(scores, alone):
            assert a == close_to(b, depth=3) and ga == gb  # batched vs alone: reordered sums


def test_common_prefix_len():
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[5], [6]]) == 0


def test_padded_runs_pay_the_fewest_positions_and_keep_empty_items_apart():
    lengths = [40, 31, 30, 12, 9, 8, 2, 1]
    assert padded_runs(lengths, int, forward_cost=64) == [[40, 31, 30], [12, 9, 8, 2, 1]]  # 120 + 60 + 2 x 64
    assert padded_runs(lengths, int, forward_cost=0) == [[n] for n in lengths]
    assert padded_runs(lengths, int, forward_cost=10**6) == [lengths]
    assert padded_runs([3, 0, 0], int, forward_cost=10**6) == [[3], [0, 0]]
    assert padded_runs([], int) == []


def test_padded_runs_are_the_cheapest_cut():
    """Against every way of cutting the sorted items (brute force over 2^(n-1) cut sets)."""
    gen = random.Random(0)
    for _ in range(200):
        lengths = sorted((gen.randint(0, 12) for _ in range(gen.randint(1, 9))), reverse=True)
        cost = gen.choice([0, 3, 16, 64])
        def paid(runs):
            return sum(len(run) * run[0] + cost for run in runs)
        cuts = [[lengths[a:b] for a, b in zip((0, *c), (*c, len(lengths)))]
                for k in range(len(lengths)) for c in itertools.combinations(range(1, len(lengths)), k)]
        allowed = [runs for runs in cuts if all(run[0] == 0 or run[-1] > 0 for run in runs)]
        got = padded_runs(lengths, int, forward_cost=cost)
        assert sum(got, []) == lengths and got in allowed
        assert paid(got) == min(paid(runs) for runs in allowed)


# few-shot documents: one long stem (a description and exemplars) before each question, and a second
# stem, so that two groups form; GEMMA3's sliding window (8) is far shorter than the stems
SHOTS = "".join(f"Question: what is {i} plus {i}?\nAnswer: {2 * i}\n\n" for i in range(1, 6))
STEMMED = [([f"Arithmetic questions.\n\n{SHOTS}Question: what is {a} plus {b}?\nAnswer:"], [f" {a + b}", f" {a + b + 1}"])
           for a, b in ((3, 4), (10, 5), (7, 7))] + \
          [([f"Geography questions, answered briefly.\n\n{SHOTS}Question: where is city {a}?\nAnswer:"],
            [" north", " south of the river"]) for a in range(3)] + DOCUMENTS[:2]


@pytest.mark.parametrize("config", [LLAMA, GEMMA3], ids=["llama", "gemma3"])
def test_documents_sharing_a_stem_run_it_once_and_score_as_the_plain_computation(config):
    from prunebench.evaluation.loglikelihood.scorer import stems

    loaded = load_tiny(name="t", config=config, seed=3)
    docs = [encode_doc(loaded.tokenizer, c, x, 256) for c, x in STEMMED]
    shared = [common_prefix_len(d.inputs) for d in docs]
    groups = sorted((sorted(members), length) for members, length in stems(docs, shared))
    # the two stems, and the documents that share none batched together in one group
    assert [members for members, _ in groups] == [[0, 1, 2], [3, 4, 5], [6, 7]] and groups[2][1] == 0
    forwards = []
    hook = loaded.model.get_decoder().register_forward_hook(lambda m, args, kwargs, out: forwards.append(
        kwargs["input_ids"].shape), with_kwargs=True)
    got = score_documents(loaded, docs)
    hook.remove()
    assert sorted(shape[0] for shape in forwards if shape[0] == 1)  # each stem is one row
    assert_equal_to_reference(loaded.model, docs, got)


# Gemma-3's mixed full and sliding layers with a window longer than every document: the documents
# then run as tries under the scorer's own mask (loglik._run_trees)
GEMMA3_WIDE = {**GEMMA3, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}


@pytest.mark.parametrize("config", [LLAMA, GEMMA3_WIDE], ids=["llama", "gemma3"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_documents_run_as_tries_feed_each_distinct_token_once_in_one_forward(config, attention):
    from prunebench.evaluation.loglikelihood.scorer import tree_masks_exact

    loaded = load_tiny(name="t", config=config, seed=3)
    loaded.model.set_attn_implementation(attention)
    docs = [encode_doc(loaded.tokenizer, c, x, 256) for c, x in DOCUMENTS]
    assert tree_masks_exact(loaded, docs)
    fed = []
    hook = loaded.decoder().register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(int((loaded.counted.weights > 0).sum())), with_kwargs=True)
    got = score_documents(loaded, docs)
    hook.remove()
    # the distinct prefixes of each document's fed sequences: its trie's nodes
    distinct = sum(len({tuple(seq[:p + 1]) for seq in doc.inputs for p in range(len(seq))}) for doc in docs)
    assert fed == [distinct]
    assert_equal_to_reference(loaded.model, docs, got)


def test_a_sliding_window_shorter_than_a_document_keeps_the_cached_path():
    from prunebench.evaluation.loglikelihood.scorer import tree_masks_exact

    loaded = load_tiny(name="t", config=GEMMA3, seed=3)  # window 8
    docs = [encode_doc(loaded.tokenizer, c, x, 256) for c, x in DOCUMENTS]
    assert not tree_masks_exact(loaded, docs)
    assert tree_masks_exact(loaded, [d for d in docs if max(map(len, d.inputs)) <= 8])
