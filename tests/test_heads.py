"""Head gates, scorers and slicing on tiny random Llama (GQA), Gemma 3, BERT and timm ViT models."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from conftest import reordered
from prunebench.models.attention import attention_heads, head_gates, slot_plan
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.heads import (HIESPruner, HISPruner, RandomHeadPruner, choose_pruned, head_statistics,
                                      min_max, prune_heads)
from prunebench.models.introspection import model_outputs
from prunebench.pruners.score_cache import cached_scores
from prunebench.pruners.structured import model_loss

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4)


def llama(dtype=torch.float32):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", num_key_value_heads=2, **SMALL)
    return AutoModelForCausalLM.from_config(config).to(dtype).eval()


def gemma3():
    torch.manual_seed(0)
    config = AutoConfig.for_model("gemma3_text", num_key_value_heads=1, head_dim=8, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention", "sliding_attention"], **SMALL)
    return AutoModelForCausalLM.from_config(config).eval()


def bert(dtype=torch.float32):
    torch.manual_seed(0)
    config = AutoConfig.for_model("bert", num_labels=3, **SMALL)
    return AutoModelForSequenceClassification.from_config(config).to(dtype).eval()


def vit(dtype=torch.float32):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, embed_dim=32,
                              depth=3, num_heads=4, num_classes=5)
    return model.to(dtype).eval()


def text_batch(labels: bool):
    torch.manual_seed(1)
    ids = torch.randint(3, 97, (2, 9))
    return {"input_ids": ids, **({"labels": ids} if labels else {})}


def bert_batch():
    torch.manual_seed(1)
    return {"input_ids": torch.randint(3, 97, (3, 7)),
            "attention_mask": torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4]),
            "labels": torch.tensor([0, 2, 1])}


def image_batch(dtype=torch.float32):
    torch.manual_seed(1)
    return {"pixel_values": torch.randn(2, 3, 16, 16, dtype=dtype), "labels": torch.tensor([1, 4])}


CASES = {"llama": (llama, lambda: text_batch(True)), "bert": (bert, bert_batch), "vit": (vit, image_batch)}


def test_slot_plan_keeps_grouped_query_attention_well_formed():
    assert slot_plan(4, 4, {1, 2}) == ([0, 3], [0, 3], set())
    # both query heads of key/value head 0 pruned: that key/value head goes with them
    assert slot_plan(4, 2, {0, 1}) == ([2, 3], [1], set())
    # one survivor in group 0, two in group 1: group 0 keeps a pruned head as an inert slot
    assert slot_plan(4, 2, {0}) == ([0, 1, 2, 3], [0, 1], {0})
    assert slot_plan(8, 2, {0, 1, 2, 5}) == ([0, 1, 3, 4, 6, 7], [0, 1], {0, 1})
    # every head pruned: one inert head keeps the layer's attention (and its KV cache) ordinary
    assert slot_plan(4, 2, {0, 1, 2, 3}) == ([0], [0], {0})


def lm_loss_fp64(model, batch):
    """The causal-LM loss without transformers' float32 upcast, which would drown a finite difference."""
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())


def rmsnorm_in_float64(model):
    """Llama's RMSNorm computes in float32 even in a float64 model; the same formula in float64."""
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = lambda x, m=module: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                            + m.variance_epsilon)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_his_equals_finite_difference_of_the_loss_per_gate(case):
    build, batch_fn = CASES[case]
    model, batch = build(torch.float64), batch_fn()
    if case == "vit":
        batch = image_batch(torch.float64)
    loss_fn = model_loss
    if case == "llama":
        model, loss_fn = rmsnorm_in_float64(model), lm_loss_fp64
    his = head_statistics(model, [batch], his=True, entropy=False, loss_fn=loss_fn)["his"]
    heads = attention_heads(model)
    eps = 1e-5
    with torch.no_grad(), head_gates(heads, requires_grad=False) as gates:
        for layer, gate in enumerate(gates):
            for h in range(len(gate)):
                gate[h] = 1 + eps
                up = float(loss_fn(model, batch))
                gate[h] = 1 - eps
                down = float(loss_fn(model, batch))
                gate[h] = 1
                # float64: central differences err by O(eps^2) + 1e-16 / eps, far under rel 1e-5
                assert his[layer][h] == pytest.approx(abs(up - down) / (2 * eps), rel=1e-5, abs=1e-9)


def michel_head_importance(model, batch, loss_fn):
    """Michel et al.'s calculate_head_importance, written from their code: with each layer's context
    (the heads' outputs) kept and its gradient retained, loss.backward(), then per layer
    dot = einsum("bhli,bhli->bhl", grad_ctx, ctx); importance += dot.abs().sum(-1).sum(0); divided
    by tot_tokens, the input mask's sum (every position where there is no mask)."""
    heads = attention_heads(model)
    ctx = {}

    def keep(layer, module, args):
        ctx[layer] = args[0]
        args[0].retain_grad()

    hooks = [h.out_proj.register_forward_pre_hook(lambda m, args, i=i: keep(i, m, args)) for i, h in enumerate(heads)]
    loss_fn(model, batch).backward()
    for hook in hooks:
        hook.remove()
    out = []
    for i, h in enumerate(heads):
        b, n = ctx[i].shape[0], ctx[i].shape[1]
        c = ctx[i].detach().reshape(b, n, h.n_heads, h.head_dim).permute(0, 2, 1, 3)  # [b, h, n, i]
        g = ctx[i].grad.reshape(b, n, h.n_heads, h.head_dim).permute(0, 2, 1, 3)
        dot = torch.einsum("bhli,bhli->bhl", g, c)
        tot_tokens = batch["attention_mask"].sum() if "attention_mask" in batch else b * n
        out.append(dot.abs().sum(-1).sum(0) / tot_tokens)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_his_token_form_is_michel_et_al_per_token_absolute_value(case):
    build, batch_fn = CASES[case]
    model = build(torch.float64)
    batch = image_batch(torch.float64) if case == "vit" else batch_fn()
    loss_fn = lm_loss_fp64 if case == "llama" else model_loss
    ours = head_statistics(model, [batch], his=True, entropy=False, loss_fn=loss_fn, his_form="token")["his"]
    reference = michel_head_importance(model, batch, loss_fn)
    for got, want in zip(ours, reference):
        # the same float64 gradients, summed in another order, then stored in float32 (one rounding, 6e-8)
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-7, atol=1e-30)
    batch_form = head_statistics(model, [batch], his=True, entropy=False, loss_fn=loss_fn)["his"]
    assert not all(torch.allclose(a, b.float()) for a, b in zip(batch_form, ours))  # a different quantity
    with pytest.raises(ValueError, match="his_form"):
        HISPruner(his_form="sample")


def direct_entropy(attentions, query_mask, key_counts):
    """Mean over valid queries of -sum p log p / log n, written out from the probabilities."""
    out = []
    for probs in attentions:
        per_head = []
        for h in range(probs.shape[1]):
            values = []
            for b in range(probs.shape[0]):
                for q in range(probs.shape[2]):
                    n = key_counts[b][q]
                    if query_mask[b][q] and n > 1:
                        p = probs[b, h, q]
                        p = p[p > 0]
                        values.append(float(-(p * p.log()).sum()) / math.log(n))
            per_head.append(sum(values) / len(values))
        out.append(torch.tensor(per_head))
    return out


def test_entropy_equals_direct_computation_with_padding_excluded():
    model, batch = bert(), bert_batch()
    ours = head_statistics(model, [batch], his=False, entropy=True)["entropy"]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    mask = batch["attention_mask"].tolist()
    counts = [[sum(row)] * len(row) for row in mask]
    # the same softmax in another order (sdpa hooks vs eager attentions), 3 layers deep
    for got, want in zip(ours, direct_entropy(attentions, mask, counts)):
        torch.testing.assert_close(got, want.float(), **reordered(want, depth=3))


def test_entropy_of_a_causal_model_normalises_by_the_keys_each_query_sees():
    model, batch = llama(), text_batch(False)
    ours = head_statistics(model, [batch], his=False, entropy=True)["entropy"]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    b, n = batch["input_ids"].shape
    mask, counts = [[1] * n] * b, [list(range(1, n + 1))] * b
    # the same softmax in another order (sdpa hooks vs eager attentions), 3 layers deep
    for got, want in zip(ours, direct_entropy(attentions, mask, counts)):
        torch.testing.assert_close(got, want.float(), **reordered(want, depth=3))


PRUNED = [{0, 1, 2, 3}, {0}, {1, 3}]  # a whole layer, an uneven GQA group, one head per group


@pytest.mark.parametrize("build", [llama, gemma3, bert, vit], ids=["llama", "gemma3", "bert", "vit"])
def test_masked_and_sliced_models_give_the_same_outputs(build):
    model = build()
    batch = image_batch() if build is vit else (bert_batch() if build is bert else text_batch(False))
    batch.pop("labels", None)
    masked, sliced = copy.deepcopy(model), copy.deepcopy(model)
    prune_heads(masked, attention_heads(masked), PRUNED, "mask")
    prune_heads(sliced, attention_heads(sliced), PRUNED, "remove")
    with torch.no_grad():
        want, got = model_outputs(masked, batch), model_outputs(sliced, batch)
    want, got = (x if isinstance(x, torch.Tensor) else x.logits for x in (want, got))
    # removing head columns only reorders o_proj's sums, 3 layers deep
    torch.testing.assert_close(got, want, **reordered(want, depth=3))
    assert sum(p.numel() for p in sliced.parameters()) < sum(p.numel() for p in model.parameters())
    # the layer with every head pruned keeps one inert head; llama's uneven GQA group {0, 1} keeps
    # head 0 as an inert slot beside head 1; everything else keeps only its survivors
    sliced_heads = attention_heads(sliced)
    assert [h.n_heads for h in sliced_heads] == [1, 4 if build is llama else 3, 2]
    assert [len(h.inert()) for h in sliced_heads] == [1, 1 if build is llama else 0, 0]
    if build is llama:
        assert [h.n_kv_heads for h in sliced_heads] == [1, 2, 2]


def test_sliced_model_saves_and_reloads_with_transformers(tmp_path):
    model = llama()
    heads = attention_heads(model)
    importance = [torch.tensor([4.0, 3.0, 2.0, 1.0]) for _ in heads]  # per layer: heads 2, 3 (one GQA group) go
    prune_heads(model, heads, choose_pruned(importance, 0.5, scope="layer"), "remove")
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = text_batch(False)["input_ids"]
    with torch.no_grad():
        want = model(ids).logits
        # the same weights reloaded: only kernel choice can differ, 3 layers deep
        torch.testing.assert_close(reloaded(ids).logits, want, **reordered(want, depth=3))
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in model.parameters())


def test_choose_pruned_global_layer_and_keep_one():
    scores = [torch.tensor([0.1, 0.2, 0.9, 0.8]), torch.tensor([0.5, 0.6, 0.7, 0.05])]
    assert choose_pruned(scores, 0.5) == [{0, 1}, {0, 3}]
    assert choose_pruned(scores, 0.25, scope="layer") == [{0}, {3}]
    low = [torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.9, 0.9, 0.9, 0.9])]
    assert choose_pruned(low, 0.5) == [{0, 1, 2, 3}, set()]
    assert choose_pruned(low, 0.5, keep_one_per_layer=True) == [{0, 1, 2}, {0}]
    # floor(n x sparsity), robust to 0.29 * 100 = 28.999...
    assert sum(map(len, choose_pruned([torch.rand(100)], 0.29))) == 29


def test_hies_combines_normalised_his_and_entropy():
    scores = {"his": [torch.tensor([0.0, 2.0]), torch.tensor([4.0, 1.0])],
              "entropy": [torch.tensor([0.5, 0.9]), torch.tensor([0.7, 0.3])]}
    his, ent = min_max(scores["his"]), min_max(scores["entropy"])
    for alpha in (0.0, 0.3, 1.0):
        got = HIESPruner(alpha=alpha, normalize="none").importance(scores)
        for g, h, e in zip(got, his, ent):
            torch.testing.assert_close(g, alpha * h + (1 - alpha) * (1 - e))  # a few elementwise fp32 ops


def test_his_is_normalised_per_layer_so_a_quiet_layer_keeps_its_heads():
    scores = {"his": [torch.tensor([0.01, 0.02]), torch.tensor([3.0, 4.0])]}
    raw, layer = HISPruner(normalize="none"), HISPruner()
    assert choose_pruned(raw.importance(scores), 0.5) == [{0, 1}, set()]
    normalised = layer.importance(scores)
    torch.testing.assert_close(normalised[1], torch.tensor([0.6, 0.8]))  # one fp32 division
    assert choose_pruned(normalised, 0.5) == [{0}, {0}]


class Windows:
    """Calibration text windows without a text file (the interface of prunebench.calibration)."""

    def samples(self, tokenizer):
        return torch.randint(3, 97, (2, 8), generator=torch.Generator().manual_seed(0))


def test_head_pruner_reports_heads_params_and_flops_and_scores_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path))
    loaded = LoadedModel(model=llama(), tokenizer=None, name="tiny", family="causal_lm", max_length=64)
    pruner = HIESPruner(alpha=0.5)
    key = {"model": "tiny", "pruner": "hies"}
    scores, hit = cached_scores(pruner, loaded, Windows(), key)
    again, hit_again = cached_scores(pruner, loaded, Windows(), key)
    assert (hit, hit_again) == (False, True)
    for name in ("his", "entropy"):
        for a, b in zip(scores[name], again[name]):
            torch.testing.assert_close(a, b)  # read back from safetensors: bitwise
    stats = pruner.apply(loaded, again, 0.5)
    assert stats["sparsity/actual"] == 0.5
    assert 0 < stats["sparsity/params"] < 0.5 and 0 < stats["sparsity/flops"] < 0.5
    assert stats["flops/per_token"] > 0


def test_random_heads_are_seeded():
    loaded = LoadedModel(model=llama(), tokenizer=None, name="tiny", family="causal_lm", max_length=64)
    first, second = RandomHeadPruner(seed=3).score(loaded), RandomHeadPruner(seed=3).score(loaded)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[0], RandomHeadPruner(seed=4).score(loaded)[0])
