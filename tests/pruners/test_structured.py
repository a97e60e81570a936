"""Depth, width and MoP pruning, and the FLOP count, on tiny random decoders."""

from __future__ import annotations

import copy

import mlflow
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import TINY_MC, close_to, compose_cfg, reordered
from prunebench.models.attention import attention_heads
from prunebench.models.flops import forward_flops
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.layers import BlockInfluencePruner, LastLayersPruner, block_influence, remove_layers
from prunebench.pruners.mop import MoPPruner, block_params
from prunebench.pruners.width import WidthPruner, amp_scores, mlp_modules

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2)


def decoder(model_type: str = "llama", layers: int = 6) -> AutoModelForCausalLM:
    torch.manual_seed(0)
    extra = {}
    if model_type == "gemma3_text":
        extra = dict(head_dim=8, sliding_window=4, sliding_window_pattern=2,
                     layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    config = AutoConfig.for_model(model_type, num_hidden_layers=layers, **SMALL, **extra)
    return AutoModelForCausalLM.from_config(config).eval()


def loaded(model) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, name="tiny", family="causal_lm", max_length=64)


class Windows:
    def samples(self, tokenizer):
        return torch.randint(3, 97, (3, 12), generator=torch.Generator().manual_seed(0))


IDS = torch.randint(3, 97, (2, 10), generator=torch.Generator().manual_seed(1))


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def test_flops_per_token_count_every_matmul_with_eager_attention():
    model = decoder(layers=2)
    tokens = 16
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    heads, d = 4, 8
    attention = 2 * (2 * tokens * tokens * heads * d) * 2  # QK^T and PV, 2 FLOPs per MAC, 2 layers
    got = forward_flops(loaded(model), tokens=tokens)["flops/per_token"]
    assert got == 2 * linear + attention / tokens
    assert model.config._attn_implementation == "sdpa"  # eager only while counting


def test_a_count_is_reused_only_for_the_same_architecture(monkeypatch):
    """Counted once per architecture in a process: a model whose layers or widths were cut is counted
    again, and every count equals a count made with nothing remembered."""
    from prunebench.models import flops

    model = decoder(layers=3)
    counts = [forward_flops(loaded(model), tokens=16)]
    remove_layers(model, {1})
    counts.append(forward_flops(loaded(model), tokens=16))
    WidthPruner().prune(loaded(model), amp_scores(model, [{"input_ids": IDS}]), 0.5)
    counts.append(forward_flops(loaded(model), tokens=16))
    assert counts[0] != counts[1] != counts[2] and forward_flops(loaded(model), tokens=16) == counts[2]
    monkeypatch.setattr(flops, "COUNTED", {})
    assert forward_flops(loaded(model), tokens=16) == counts[2]
    assert forward_flops(loaded(decoder(layers=3)), tokens=16) == counts[0]


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_removed_layers_run_cache_save_and_reload(model_type, tmp_path):
    model = decoder(model_type)
    remove_layers(model, {1, 2})
    assert model.config.num_hidden_layers == 4
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]
    if model_type == "gemma3_text":
        assert model.config.layer_types == ["sliding_attention", "full_attention"] * 2
    # cached decoding equals the full forward (the cache is indexed by the renumbered layers)
    with torch.no_grad():
        out = model.generate(IDS[:1], max_new_tokens=5, do_sample=False)
        step = model(out[:, :-1]).logits[0, -5:].argmax(-1)
    assert torch.equal(step, out[0, -5:])
    model.save_pretrained(tmp_path)
    # the same weights reloaded run the same kernels: assert_close's fp32 default (about 10 eps) suffices
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path).eval()), logits(model))


def test_block_influence_equals_one_minus_cosine_of_hidden_states():
    model = decoder()
    ids = Windows().samples(None)
    bi = block_influence(model, [{"input_ids": ids}])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    # hidden_states[i] enters block i; the last entry is after the final norm, so skip the last block
    for i in range(len(bi) - 1):
        cos = torch.nn.functional.cosine_similarity(hidden[i], hidden[i + 1], dim=-1).mean()
        # the same cosine from hooked vs returned hidden states, 6 layers deep
        assert float(bi[i]) == close_to(1 - float(cos), depth=6)


def test_layer_pruners_remove_the_chosen_blocks():
    lm = loaded(decoder())
    scores = torch.tensor([0.5, 0.1, 0.9, 0.2, 0.8, 0.7])
    assert BlockInfluencePruner().drop(scores, 6, 3) == {1, 3, 0}
    assert LastLayersPruner("layers_last").drop(None, 6, 3) == {1, 2, 3}
    assert LastLayersPruner("layers_last").drop(None, 6, 6) == {0, 1, 2, 3}  # the last two always stay
    stats = LastLayersPruner("layers_last").apply(lm, None, 0.5)
    assert stats["sparsity/actual"] == 0.5 and len(lm.model.model.layers) == 3
    assert stats["sparsity/params"] > 0 and stats["sparsity/flops"] > 0


def test_width_pruning_equals_masking_the_same_heads_and_neurons(tmp_path):
    model = decoder()
    lm = loaded(copy.deepcopy(model))
    pruner = WidthPruner()
    scores = pruner.score(lm, Windows())
    stats = pruner.apply(lm, scores, 0.5)
    assert stats == pytest.approx({**stats, "sparsity/actual": 0.5, "sparsity/heads": 0.5})
    # the reference: zero the output columns of the same dropped heads and neurons
    masked = copy.deepcopy(model)
    with torch.no_grad():
        for h, mlp, head_score, neuron_score in zip(attention_heads(masked), mlp_modules(masked),
                                                    scores["heads"], scores["neurons"]):
            for group in (0, 2):  # GQA: the weaker query head of each key/value group goes
                head = group + int(torch.argmin(head_score[group:group + 2]))
                h.out_proj.weight[:, head * 8:(head + 1) * 8] = 0
            mlp.down_proj.weight[:, torch.argsort(neuron_score, descending=True, stable=True)[24:]] = 0
    want = logits(masked)
    # slicing out zeroed columns only reorders the projections' sums, 6 layers deep
    torch.testing.assert_close(logits(lm.model), want, **reordered(want, depth=6))
    config = lm.model.config
    assert (config.intermediate_size, config.num_attention_heads, config.num_key_value_heads) == (24, 2, 2)
    lm.model.save_pretrained(tmp_path)
    # the same weights reloaded run the same kernels: assert_close's fp32 default (about 10 eps) suffices
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path).eval()), logits(lm.model))


def test_amp_neuron_scores_are_mean_absolute_down_proj_inputs():
    model = decoder(layers=2)
    ids = Windows().samples(None)
    seen = []
    hook = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(ids)
    hook.remove()
    scores = amp_scores(model, [{"input_ids": ids[:2]}, {"input_ids": ids[2:]}])
    # one mean over the same values, batched in two: fp32 default tolerance
    torch.testing.assert_close(scores["neurons"][1], seen[0].abs().mean((0, 1)))


@pytest.mark.parametrize("selector", ["random", "perplexity"])
def test_mop_reaches_the_ratio_of_block_parameters(selector, tmp_path):
    lm = loaded(decoder(layers=8))
    start = block_params(lm.model)
    pruner = MoPPruner(selector=selector, seed=1)
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.4)
    assert stats["sparsity/actual"] == pytest.approx(1 - block_params(lm.model) / start)
    assert 0.4 <= stats["sparsity/actual"] < 0.45
    assert set(stats["mop/sequence"]) <= {"L", "G"} and len(stats["mop/sequence"]) >= 3
    assert stats["mop/layers_removed"] == 8 - len(lm.model.model.layers)
    lm.model.save_pretrained(tmp_path)
    # the same weights reloaded run the same kernels: assert_close's fp32 default (about 10 eps) suffices
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path).eval()), logits(lm.model))


def test_mop_random_sequence_is_seeded():
    runs = []
    for seed in (1, 1, 2):
        lm = loaded(decoder(layers=8))
        pruner = MoPPruner(seed=seed)
        runs.append(pruner.apply(lm, pruner.score(lm, Windows()), 0.5)["mop/sequence"])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_mop_job_logs_its_sequence_as_a_tag_and_structure_metrics(store, tmp_path):
    from prunebench.job import run

    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    overrides = TINY_MC + ["pruner=mop", "sparsity=0.5", "calib=file", f"calib.path={text}", "calib.n_samples=2",
                           "calib.seq_len=16", "tracking.ensure_dense=false"]
    metrics = run(compose_cfg(overrides))
    assert metrics["sparsity/actual"] >= 0.5 and metrics["sparsity/params"] > 0
    assert metrics["flops/per_token"] > 0 and metrics["sparsity/flops"] > 0
    run_row = mlflow.search_runs(experiment_names=["prunebench"]).iloc[0]
    assert set(run_row["tags.mop/sequence"]) <= {"L", "G"}
    assert "metrics.mop/sequence" not in run_row


def test_transformer_blocks_of_a_composite_model_are_its_language_models():
    """A vision-language model's config holds the layer count in `text_config`; its vision tower
    has as many blocks here, and is not the one pruned."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    from prunebench.models.introspection import transformer_blocks

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = LlavaConfig(text_config=LlamaConfig(**small, num_key_value_heads=2, vocab_size=128),
                         vision_config=CLIPVisionConfig(**small, image_size=32, patch_size=8), image_token_index=5)
    name, blocks = transformer_blocks(LlavaForConditionalGeneration(config))
    assert name == "model.language_model.layers" and len(blocks) == 2


def mha_decoder(layers: int = 6) -> AutoModelForCausalLM:
    """Multi-head attention, as LLaMA-2-7B (the released rule's model): 4 heads of 8, 48 neurons."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", num_hidden_layers=layers, **{**SMALL, "num_key_value_heads": 4})
    return AutoModelForCausalLM.from_config(config).eval()


def shapes(model) -> tuple[int, set[int], set[int]]:
    return (len(model.model.layers), {h.n_heads for h in attention_heads(model)},
            {m.down_proj.in_features for m in mlp_modules(model)})


def test_mop_released_sequence_removes_the_layers_and_widths_it_implies():
    # By hand, per block: attention 4 x 32 x 32 = 4096, MLP 3 x 32 x 48 = 4608, norms 64.
    # G1: p = 8768 / (6 x 8704) = 0.1679: round(4p) = 1 head, round(52p - 1) = 8 neurons -> 3 heads, 40 neurons.
    # L2: the block at index len - 3 = 3 goes -> 5 blocks of 3072 + 3840 + 64 = 6976.
    # G3: p = 6976 / (5 x 6912) = 0.2019: round(3p) = 1 head, round(43p - 1) = 8 neurons -> 2 heads, 32 neurons.
    lm = loaded(mha_decoder())
    pruner = MoPPruner(sequence="GLGGL", steps=3, g_rule="released")
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.9)
    assert stats["mop/sequence"] == "GLG" and stats["mop/steps"] == 3 and stats["mop/layers_removed"] == 1
    assert shapes(lm.model) == (5, {2}, {32})
    assert stats["mop/width_fraction"] == pytest.approx(1 - 32 / 48)  # a ratio of integers, rounded once
    # q, k, v, o of 2 heads x 8 dims, gate/up/down of 32 neurons, 2 norms, 5 blocks
    assert block_params(lm.model) == 5 * (4 * 2 * 8 * 32 + 3 * 32 * 32 + 64)


def test_mop_released_mlp_only_keeps_every_head():
    # G1: p = 8768 / (6 x 4608) = 0.3171: round(48p) = 15 -> 33 neurons.
    # G2: layer 0 = 4096 + 3 x 32 x 33 + 64 = 7328, p = 7328 / (6 x 3168) = 0.3855: round(33p) = 13 -> 20.
    lm = loaded(mha_decoder())
    pruner = MoPPruner(sequence="G", steps=2, g_rule="released", mlp_only=True)
    pruner.apply(lm, pruner.score(lm, Windows()), 0.9)
    assert shapes(lm.model) == (6, {4}, {20})


def test_mop_released_steps_are_whole_and_stop_at_the_ratio():
    lm = loaded(mha_decoder())
    start = sum(p.numel() for p in lm.model.parameters())
    pruner = MoPPruner(sequence="LGGLLLGGLLGLGLLGGL", g_rule="released", ratio_of="model")
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.25)
    # L (one block of 8768 of 58848 = 14.9%), then G: past 25% after the second step, never cut short
    assert stats["mop/sequence"] == "LG"
    # the same integer ratio computed twice
    assert stats["sparsity/actual"] == pytest.approx(1 - sum(p.numel() for p in lm.model.parameters()) / start)
    assert stats["sparsity/actual"] >= 0.25


def test_mop_released_sequence_refuses_a_step_it_cannot_take():
    lm = loaded(mha_decoder(layers=3))
    pruner = MoPPruner(sequence="LL", g_rule="released")
    with pytest.raises(ValueError, match="step 2 is L"):
        pruner.apply(lm, pruner.score(lm, Windows()), 0.9)


def test_amp_batch_average_weighs_each_batch_once():
    model = decoder(layers=2)
    ids = Windows().samples(None)
    short, long = {"input_ids": ids[:1, :4]}, {"input_ids": ids[1:]}
    per_batch = amp_scores(model, [short, long], average="batch")
    alone = [amp_scores(model, [b])["neurons"][0] for b in (short, long)]
    # the mean of two means, each computed the same way: fp32 default tolerance
    torch.testing.assert_close(per_batch["neurons"][0], (alone[0] + alone[1]) / 2)
