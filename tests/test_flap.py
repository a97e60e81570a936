"""FLAP against a reference written from the released code (CASIA-IVA-Lab/FLAP: lib/layerwrapper.py's
BiasGPT, lib/prune.py's prune_flap, cal_remove_neuron and compress), step by step, on a tiny
multi-head Llama (one key/value head per query head, as the release's Llama-1/2); then what the
release does not cover: grouped-query attention, the export, the refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import TINY_MC, compose_cfg
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.flap import FlapPruner
from prunebench.validate import ConfigError, validate

HIDDEN, HEADS, NEURONS, LAYERS = 32, 4, 48, 3
HEAD_DIM = HIDDEN // HEADS
IDS = torch.randint(3, 97, (6, 12), generator=torch.Generator().manual_seed(0))


def decoder(kv_heads: int = HEADS) -> AutoModelForCausalLM:
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=97, hidden_size=HIDDEN, intermediate_size=NEURONS,
                                  num_attention_heads=HEADS, num_key_value_heads=kv_heads,
                                  num_hidden_layers=LAYERS, initializer_range=0.2)
    return AutoModelForCausalLM.from_config(config).eval()


def loaded(model) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, name="tiny", family="causal_lm", max_length=64)


class Windows:
    def samples(self, tokenizer):
        return IDS


# ---- the reference: the released algorithm, step by step ------------------------------------------

class ReleasedStats:
    """BiasGPT.add_batch as released: a running mean of each sample's token mean, and the running
    fluctuation whose "old" mean is the very tensor updated in place (so both deviations are from the
    new mean), the first sample contributing none; WIFN keeps the running mean of token sums of
    squares instead."""

    def __init__(self, width: int, metric: str):
        self.metric, self.n = metric, 0
        self.baseline = torch.zeros(width)
        self.other = torch.zeros(width)  # scaler_inp for WIFN, fluc_inp otherwise

    def add(self, inp: torch.Tensor) -> None:
        b = inp.shape[0]
        x = inp.reshape(-1, inp.shape[-1]).t().float()  # (channels, tokens)
        old = self.baseline  # an alias, as in the release
        self.baseline *= self.n / (self.n + b)
        self.baseline += x.mean(1) / (self.n + b)
        if self.metric == "WIFN":
            self.other *= self.n / (self.n + b)
            self.other += x.norm(p=2, dim=1) ** 2 / (self.n + b)
        elif self.n == 0:
            self.other = torch.zeros_like(self.other)
        else:
            self.other *= (self.n - 1) / (self.n + b - 1)
            self.other += ((x - self.baseline[:, None]) * (x - old[:, None])).sum(1) / (self.n + b)
        self.n += b


def released_metric(metric: str, stats: ReleasedStats, weight: torch.Tensor) -> torch.Tensor:
    if metric == "IFV":
        return stats.other
    if metric == "WIFV":
        return stats.other * weight.pow(2).sum(0)
    return (weight.abs() * stats.other.sqrt()[None]).mean(0)


def released_neurons_removed(structure: str, ratio: float, remove_heads: int) -> int:
    """cal_remove_neuron with Llama's shapes: 4 H x H attention matrices, 3 H x I MLP matrices."""
    if structure == "UL-MM":
        budget = ratio * (NEURONS * HIDDEN * 3 + HIDDEN * HIDDEN * 4)
        return int((budget - HIDDEN * 4 * (remove_heads // LAYERS) * HEAD_DIM) / (HIDDEN * 3))
    budget = LAYERS * ratio * (NEURONS * HIDDEN * 3 + HIDDEN * HIDDEN * 4)
    return int((budget - HIDDEN * 4 * remove_heads * HEAD_DIM) / (HIDDEN * 3))


def standardise(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)


@torch.no_grad()
def released_flap(model, metric: str, structure: str, ratio: float, remove_heads: int,
                  standardised: bool = True, fluctuation: bool = True):
    """prune_flap's decisions and compress's biases: (head masks [L, heads], neuron masks [L, I],
    o_proj biases, down_proj biases). `standardised=False` skips the standardisation across layers,
    `fluctuation=False` scores inputs by their magnitude (sum of squares) instead of their
    fluctuation: the naive variants the test must tell apart."""
    layers = model.model.layers
    stats = {}
    handles = []
    for i, layer in enumerate(layers):
        for name, proj in (("attn", layer.self_attn.o_proj), ("mlp", layer.mlp.down_proj)):
            stats[i, name] = ReleasedStats(proj.in_features, metric)
            magnitude = ReleasedStats(proj.in_features, "WIFN")
            stats[i, name, "magnitude"] = magnitude
            handles.append(proj.register_forward_hook(
                lambda m, inp, out, s=stats[i, name], g=magnitude: s.add(inp[0]) or g.add(inp[0])))
    for j in range(len(IDS)):  # one sample at a time; each layer sees the dense previous layers' outputs
        model(IDS[j:j + 1])
    for handle in handles:
        handle.remove()

    def score(i, name, proj):
        return released_metric(metric, stats[i, name] if fluctuation else stats[i, name, "magnitude"],
                               proj.weight.float())

    attn = [score(i, "attn", layer.self_attn.o_proj) ** 2 for i, layer in enumerate(layers)]
    mlp = [score(i, "mlp", layer.mlp.down_proj) for i, layer in enumerate(layers)]
    if structure.startswith("UL"):
        head_masks, neuron_masks = [], []
        for a, m in zip(attn, mlp):
            heads = a.reshape(-1, HEAD_DIM).sum(1)
            k_heads = int(ratio * HEADS) if structure == "UL-UM" else remove_heads // LAYERS
            k_neurons = (int(m.numel() * ratio) if structure == "UL-UM"
                         else released_neurons_removed(structure, ratio, remove_heads))
            head_masks.append(heads >= torch.sort(heads)[0][k_heads])
            neuron_masks.append(m >= torch.sort(m)[0][k_neurons])
        head_mask, neuron_mask = torch.stack(head_masks), torch.stack(neuron_masks)
    else:
        a, m = torch.stack(attn), torch.stack(mlp)
        if standardised:
            a, m = standardise(a), standardise(m)
        a = a.reshape(LAYERS, -1, HEAD_DIM).mean(dim=2)
        if structure == "AL-MM":
            head_mask = a > torch.sort(a.view(-1), descending=True)[0][-remove_heads]
            n = released_neurons_removed(structure, ratio, remove_heads)
            neuron_mask = m > torch.sort(m.view(-1), descending=True)[0][-n]
        else:
            values, indices = torch.sort(torch.cat([a.view(-1), m.view(-1)]), descending=True)
            weight = torch.ones_like(indices)
            weight[indices < a.numel()] = 4 * HEAD_DIM / 3  # an int64 tensor: stored truncated
            cut = torch.argmin(torch.abs(torch.cumsum(weight, 0) - torch.sum(weight) * (1 - ratio)))
            head_mask, neuron_mask = a > values[cut], m > values[cut]
    o_bias, down_bias = [], []
    for i, layer in enumerate(layers):
        channels = head_mask[i].repeat_interleave(HEAD_DIM)
        o_bias.append((stats[i, "attn"].baseline * ~channels) @ layer.self_attn.o_proj.weight.T)
        down_bias.append((stats[i, "mlp"].baseline * ~neuron_mask[i]) @ layer.mlp.down_proj.weight.T)
    return head_mask, neuron_mask, o_bias, down_bias


def ours(model, sparsity: float, **options):
    pruned = loaded(copy.deepcopy(model))
    pruner = FlapPruner(batch_size=2, **options)  # per-sample statistics whatever the batch
    stats = pruner.apply(pruned, pruner.score(pruned, Windows()), sparsity)
    return pruned.model, stats


CASES = [("WIFV", "AL-AM", 0.4, 0), ("IFV", "AL-MM", 0.3, 3), ("WIFN", "UL-UM", 0.3, 0), ("WIFV", "UL-MM", 0.3, 3)]


@pytest.mark.parametrize(("metric", "structure", "ratio", "remove_heads"), CASES)
def test_kept_channels_and_compensation_bias_equal_the_released_algorithms(metric, structure, ratio, remove_heads):
    dense = decoder()
    heads, neurons, o_bias, down_bias = released_flap(dense, metric, structure, ratio, remove_heads)
    assert heads.any(1).all() and not heads.all() and not neurons.all()  # every layer keeps heads; some go
    pruned, _ = ours(dense, ratio, metric=metric, structure=structure, remove_heads=remove_heads)
    for i, (before, after) in enumerate(zip(dense.model.layers, pruned.model.layers)):
        channels = heads[i].repeat_interleave(HEAD_DIM)
        assert torch.equal(after.self_attn.o_proj.weight, before.self_attn.o_proj.weight[:, channels])
        assert torch.equal(after.self_attn.q_proj.weight, before.self_attn.q_proj.weight[channels])
        assert torch.equal(after.self_attn.k_proj.weight, before.self_attn.k_proj.weight[channels])
        assert torch.equal(after.mlp.down_proj.weight, before.mlp.down_proj.weight[:, neurons[i]])
        assert torch.equal(after.mlp.gate_proj.weight, before.mlp.gate_proj.weight[neurons[i]])
        # the same sums of 72 fp32 tokens in another order: a few ulp of the mean, times |W| ~ 1
        torch.testing.assert_close(after.self_attn.o_proj.bias, o_bias[i], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(after.mlp.down_proj.bias, down_bias[i], rtol=1e-5, atol=1e-6)
        assert o_bias[i].abs().max() > 1e-2 and down_bias[i].abs().max() > 1e-2  # compensation is not zero


def test_the_naive_variants_decide_otherwise_on_this_model():
    """What makes the test above able to fail: without the standardisation, or with the inputs'
    magnitude in place of their fluctuation, the released AL-AM keeps other channels here."""
    dense = decoder()
    reference = released_flap(dense, "WIFV", "AL-AM", 0.4, 0)
    for naive in (dict(standardised=False), dict(fluctuation=False)):
        variant = released_flap(dense, "WIFV", "AL-AM", 0.4, 0, **naive)
        assert not (torch.equal(variant[0], reference[0]) and torch.equal(variant[1], reference[1])), naive


@torch.no_grad()
def test_the_bias_keeps_the_mean_output_on_the_calibration_data():
    """Fed the dense model's inputs, a pruned projection's mean output over the calibration tokens
    is the dense one's with the bias, and not without: layer 0's attention (its input does not
    change with pruning), and every MLP given the dense MLP's inputs."""
    dense = decoder(kv_heads=2)
    inputs = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for layer in dense.model.layers]
    dense(IDS)
    for hook in hooks:
        hook.remove()

    def means(model):
        seen = []
        hook = model.model.layers[0].self_attn.o_proj.register_forward_hook(lambda m, i, o: seen.append(o))
        model(IDS)
        hook.remove()
        return [seen[0]] + [layer.mlp(x) for layer, x in zip(model.model.layers, inputs)]

    reference = [out.reshape(-1, HIDDEN).mean(0) for out in means(dense)]
    with_bias, without = (means(ours(dense, 0.5, **options)[0]) for options in ({}, {"bias": False}))
    for expected, kept, plain in zip(reference, with_bias, without):
        # means of 72 fp32 tokens summed in another order, of outputs of order 1
        torch.testing.assert_close(kept.reshape(-1, HIDDEN).mean(0), expected, rtol=1e-4, atol=1e-5)
        assert (plain.reshape(-1, HIDDEN).mean(0) - expected).abs().max() > 1e-2


def test_grouped_query_attention_removes_whole_key_value_groups():
    pruned, stats = ours(decoder(kv_heads=2), 0.5)
    shapes = [(layer.self_attn.q_proj.out_features // HEAD_DIM, layer.self_attn.k_proj.out_features // HEAD_DIM)
              for layer in pruned.model.layers]
    assert all(q == 2 * kv for q, kv in shapes) and sum(q for q, _ in shapes) < LAYERS * HEADS
    assert stats["sparsity/heads"] == 1 - sum(q for q, _ in shapes) / (LAYERS * HEADS)
    assert 0.3 < stats["sparsity/actual"] < 0.7  # the cost-weighted cut lands near the ratio asked


def test_a_model_family_it_does_not_prune_is_refused_before_loading():
    with pytest.raises(ConfigError, match=r"pruner='flap' cannot apply to model='tiny-mixtral' \(family 'moe'\)"):
        validate(compose_cfg(TINY_MC + ["model=tiny-mixtral", "pruner=flap", "calib=wikitext2"]))
    with pytest.raises(ConfigError, match="structure='AL'"):
        validate(compose_cfg(TINY_MC + ["pruner=flap", "pruner.structure=AL", "calib=wikitext2"]))


def test_a_config_that_cannot_state_the_biases_is_refused_at_export(tmp_path):
    from prunebench.export.folder import widths, write_pretrained

    torch.manual_seed(0)
    config = AutoConfig.for_model("gemma3_text", vocab_size=97, hidden_size=HIDDEN, intermediate_size=NEURONS,
                                  num_attention_heads=HEADS, num_key_value_heads=2, head_dim=HEAD_DIM,
                                  num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    model = AutoModelForCausalLM.from_config(config).eval()
    before = widths(model)
    pruned, _ = ours(model, 0.3)
    with pytest.raises(ValueError, match="gemma3_text.*no `mlp_bias`"):
        write_pretrained(loaded(pruned), tmp_path, {}, before)


@pytest.fixture
def calib(calib_text) -> list[str]:
    return calib_text(4)


def test_export_reloads_to_the_same_predictions_with_its_biases_and_fewer_parameters(store, tmp_path, calib):
    from safetensors import safe_open
    from helpers.export import round_trip

    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters

    pruned, _, folder, pruning = round_trip("tiny-llama", ["pruner=flap", "sparsity=0.5", *calib], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["attention_bias"] and config["mlp_bias"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.layers.0.mlp.down_proj.bias").abs().max() > 0
        assert not f.get_tensor("model.layers.0.mlp.up_proj.bias").any()  # stated by mlp_bias, zero
        stored_neurons = [f.get_slice(f"model.layers.{i}.mlp.up_proj.weight").get_shape()[0] for i in range(2)]
    after = pruning["structure"]["language"]["after"]
    # the global ranking leaves the layers different widths, each stored at its own (not padded to the widest)
    assert len({layer["neurons"] for layer in after}) > 1
    assert pruning["layout"] == "per_layer" and not pruning["padded"]
    assert stored_neurons == [layer["neurons"] for layer in after]
    assert config["intermediate_size"] == max(layer["neurons"] for layer in after)
    # exactly the pruned model's parameters, and the zero biases attention_bias / mlp_bias state on q/k/v, gate/up
    zero_biases = sum((layer["heads"] + 2 * layer["kv_heads"]) * config["head_dim"] + 2 * layer["neurons"] for layer in after)
    assert pruning["params_stored"] - zero_biases == pruned.data.metrics["params/total"]
    assert pruning["params_stored"] < count_parameters(get_model(compose_cfg(["model=tiny-llama"]).model).model)


def test_a_target_the_structure_cannot_reach_is_said_and_recorded_as_reached(caplog):
    """At 0.99 AL-AM removes every group of every layer, and each layer keeps one zeroed group (weights
    that still count): what it reaches falls well short, which the log says and sparsity/actual records."""
    lm = loaded(decoder())
    pruner = FlapPruner()
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.99)
    assert stats["sparsity/actual"] < 0.97
    assert f"FLAP AL-AM removed {stats['sparsity/actual']:.3f}" in caplog.text and "short of sparsity=0.99" in caplog.text
    caplog.clear()
    lm = loaded(decoder())
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.5)
    assert abs(stats["sparsity/actual"] - 0.5) < 0.02 and "short of" not in caplog.text
