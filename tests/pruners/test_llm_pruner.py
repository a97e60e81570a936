"""LLM-Pruner (block-wise, no recovery) against the released algorithm written out step by step from
horseee/LLM-Pruner: hf_prune.py / llama3.py (gradients), LLMPruner/pruner/hf_llama_pruner.py
(TaylorImportance) and LLMPruner/torch_pruning's MetaPruner.prune_local (per-layer counts)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import TINY_MC, compose_cfg, reordered
from prunebench.models.loaded import LoadedModel
from prunebench.pruners import llm_pruner
from prunebench.pruners.llm_pruner import LLMPruner, layer_span
from prunebench.validate import ConfigError, validate

pytestmark = pytest.mark.usefixtures("one_thread")

# 4 layers: LLaMA-7B's 4..30 of 32 mapped by fraction is 1..4 here, so layer 0 stays whole
LAYERS, PRUNED = 4, range(1, 4)
N_WINDOWS, RATIO = 10, 0.5  # the release's num_examples; half the heads and neurons


def decoder(kv_heads: int) -> AutoModelForCausalLM:
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                                  num_key_value_heads=kv_heads, num_hidden_layers=LAYERS)
    return AutoModelForCausalLM.from_config(config).eval()


class Windows:
    def samples(self, tokenizer):
        return WINDOWS


WINDOWS = torch.randint(3, 97, (N_WINDOWS, 16), generator=torch.Generator().manual_seed(0))


def loaded(model) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, name="tiny", family="causal_lm", max_length=64)


# ---- the release, step by step ------------------------------------------------------------------

def released_gradients(model, second: bool) -> dict:
    """hf_prune.py/llama3.py: every parameter requires grad; for param_second/param_mix each window
    alone is backpropagated and grad * grad / num_examples summed into acc_grad (zero_grad between);
    then all windows as one batch, `model(x, labels=x).loss.backward()`, leave `.grad`."""
    for p in model.parameters():
        p.requires_grad_(True)
    acc = {}
    if second:
        for j in range(N_WINDOWS):
            x = WINDOWS[j].unsqueeze(0)
            model(x, labels=x).loss.backward()
            for p in model.parameters():
                square = p.grad * p.grad / N_WINDOWS
                acc[p] = acc[p] + square if p in acc else square.clone()
            model.zero_grad()
    model(WINDOWS, labels=WINDOWS).loss.backward()
    return acc


def released_local_norm(linear, acc, taylor: str, out_channels: bool) -> torch.Tensor:
    """TaylorImportance.__call__ for a Linear's out (rows) or in (columns) channels."""
    w = linear.weight
    salience = w * w.grad
    if taylor == "param_second":
        salience = w * acc[w] * w
    elif taylor == "param_mix":
        salience = salience - 0.5 * w * acc[w] * w
    dim = 1 if out_channels else 0
    return salience.sum(dim).abs() if taylor == "vectorize" else salience.abs().sum(dim)


def released_reduce(group_imp: list[torch.Tensor], how: str) -> torch.Tensor:
    """The alignment to the shortest vector (`view(len // min, min).sum(0)`) and `_reduce`."""
    size = min(len(imp) for imp in group_imp)
    stacked = torch.stack([imp.view(len(imp) // size, size).sum(0) for imp in group_imp])
    return {"sum": lambda: stacked.sum(0), "mean": lambda: stacked.mean(0), "max": lambda: stacked.max(0)[0],
            "prod": lambda: torch.prod(stacked, 0), "first": lambda: stacked[0]}[how]()


def released_block_wise(model, taylor: str, how: str) -> dict[str, dict[int, tuple[torch.Tensor, list[int]]]]:
    """Per pruned layer: (group importance per head / neuron, the units MetaPruner.prune_local removes).
    Roots as hf_prune.py sets them: q_proj with consecutive_groups = head_dim (its group: q, k, v
    out channels, o in channels), gate_proj (gate, up out channels, down in channels)."""
    acc = released_gradients(model, taylor in ("param_second", "param_mix"))
    out = {"attention": {}, "mlp": {}}
    with torch.no_grad():
        for i in PRUNED:
            attn, mlp = model.model.layers[i].self_attn, model.model.layers[i].mlp
            deps = [(attn.q_proj, True), (attn.k_proj, True), (attn.v_proj, True), (attn.o_proj, False)]
            imp = released_reduce([released_local_norm(lin, acc, taylor, o) for lin, o in deps], how)
            imp = imp.view(-1, attn.head_dim).sum(1)  # consecutive_groups
            channels = attn.q_proj.out_features
            n_pruned = channels - int(channels * (1 - RATIO))
            out["attention"][i] = (imp, sorted(torch.argsort(imp)[:n_pruned // attn.head_dim].tolist()))
            deps = [(mlp.gate_proj, True), (mlp.up_proj, True), (mlp.down_proj, False)]
            imp = released_reduce([released_local_norm(lin, acc, taylor, o) for lin, o in deps], how)
            channels = mlp.gate_proj.out_features
            n_pruned = channels - int(channels * (1 - RATIO))
            out["mlp"][i] = (imp, sorted(torch.argsort(imp)[:n_pruned].tolist()))
    return out


# ---- ours ---------------------------------------------------------------------------------------

def removed(scores, model) -> dict[str, dict[int, list[int]]]:
    """The units our prune step removes, read from the scores as it does."""
    out = {"attention": {}, "mlp": {}}
    for kind, per_layer in scores.items():
        for i, score in per_layer.items():
            unit = model.model.layers[i].self_attn.head_dim if kind == "attention" else 1
            count = llm_pruner.pruned_count(len(score) * unit, RATIO) // unit
            out[kind][i] = sorted(torch.argsort(score, stable=True)[:count].tolist())
    return out


def units_of(reference) -> dict[str, dict[int, list[int]]]:
    return {kind: {i: units for i, (_, units) in per.items()} for kind, per in reference.items()}


def ours(model, **options):
    return LLMPruner(**options).score(loaded(model), Windows())


CASES = [("param_first", "sum"), ("vectorize", "sum"), ("param_second", "sum"), ("param_mix", "sum"),
         ("param_first", "mean"), ("param_first", "max"), ("param_first", "prod"), ("param_first", "first")]


@pytest.mark.parametrize("taylor, how", CASES)
def test_taylor_scores_and_removed_units_equal_the_released_block_wise_pruner(taylor, how):
    model = decoder(kv_heads=4)  # the release's LLaMA: one key/value head per query head
    reference = released_block_wise(copy.deepcopy(model), taylor, how)
    scores = ours(model, taylor=taylor, group_reduction=how)
    assert set(scores["attention"]) == set(scores["mlp"]) == set(PRUNED)
    for kind in ("attention", "mlp"):
        for i in PRUNED:
            expected = reference[kind][i][0]
            # per-window gradients summed vs one batch's: the same sums in another order; the
            # products and the importances' own sums add a few hundred terms more (depth 4)
            torch.testing.assert_close(scores[kind][i], expected, **reordered(expected, depth=4))
    assert removed(scores, model) == units_of(reference)


def test_removing_the_key_steps_changes_what_is_removed(monkeypatch):
    """The comparison above can fail: on this model |w| in place of |w * grad|, or the root layer's
    channels alone in place of the coupled group's, remove other heads or neurons."""
    model = decoder(kv_heads=4)
    reference = released_block_wise(copy.deepcopy(model), "param_first", "sum")
    expected = units_of(reference)
    assert removed(ours(model), model) == expected
    with monkeypatch.context() as patch:
        patch.setattr(llm_pruner, "salience", lambda weight, grad, square, taylor: weight.detach().float())
        magnitude = removed(ours(model), model)
    for kind in ("attention", "mlp"):
        assert magnitude[kind] != expected[kind], kind
    uncoupled = removed(ours(model, group_reduction="first"), model)
    for kind in ("attention", "mlp"):
        assert uncoupled[kind] != expected[kind], kind


def test_grouped_query_attention_scores_and_removes_whole_key_value_groups():
    """A key/value group's score is the Taylor sum over every weight removed with it: its key and
    value rows, and the query rows and output columns of the query heads repeat_kv gives it; pruning
    equals zeroing those heads' output columns and the removed neurons' down-projection columns."""
    model = decoder(kv_heads=2)
    reference = copy.deepcopy(model)
    released_gradients(reference, second=False)
    scores = ours(model)
    taylor = lambda linear: (linear.weight * linear.weight.grad).abs().detach()  # noqa: E731
    for i in PRUNED:
        attn = reference.model.layers[i].self_attn
        d = attn.head_dim
        q, k, v, o = (taylor(lin) for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        kv, queries = (lambda g: slice(g * d, (g + 1) * d)), (lambda g: slice(2 * g * d, (2 * g + 2) * d))
        expected = torch.stack([k[kv(g)].sum() + v[kv(g)].sum() + q[queries(g)].sum() + o[:, queries(g)].sum()
                                for g in range(2)])
        torch.testing.assert_close(scores["attention"][i], expected, **reordered(expected, depth=4))

    masked = copy.deepcopy(model)
    gone = removed(scores, model)
    metrics = LLMPruner().apply(loaded(model), scores, RATIO)
    with torch.no_grad():
        for i in PRUNED:
            layer = masked.model.layers[i]
            for g in gone["attention"][i]:
                layer.self_attn.o_proj.weight[:, 2 * g * 8:(2 * g + 2) * 8] = 0
            layer.mlp.down_proj.weight[:, gone["mlp"][i]] = 0
        expected, got = masked(WINDOWS).logits, model(WINDOWS).logits
    torch.testing.assert_close(got, expected, **reordered(expected, depth=LAYERS))
    assert [len(gone["attention"][i]) for i in PRUNED] == [1, 1, 1]
    assert [(layer.self_attn.k_proj.out_features, layer.self_attn.q_proj.out_features, layer.mlp.down_proj.in_features)
            for layer in model.model.layers] == [(16, 32, 48)] + [(8, 16, 24)] * 3
    assert metrics["sparsity/actual"] == 0.5 and metrics["sparsity/heads"] == 6 / 16


def test_a_layer_whose_count_would_take_every_unit_stays_whole():
    model = decoder(kv_heads=1)  # one key/value group: pruning it would empty the attention
    scores = ours(model)
    LLMPruner().apply(loaded(model), scores, 0.9)
    assert [layer.self_attn.q_proj.out_features for layer in model.model.layers] == [32] * 4
    assert [layer.mlp.down_proj.in_features for layer in model.model.layers] == [48] + [4] * 3


@pytest.mark.parametrize("layers, mapping, expected", [
    (32, "fraction", range(4, 30)), (30, "fraction", range(4, 28)), (18, "fraction", range(2, 17)),
    (2, "fraction", range(0, 2)), (30, "index", range(4, 30)), (2, "index", range(2, 2))])
def test_the_released_layer_range_maps_to_other_depths(layers, mapping, expected):
    assert layer_span(4, 30, 32, layers, mapping) == expected


def test_a_model_family_it_does_not_prune_is_refused_before_loading():
    with pytest.raises(ConfigError, match=r"pruner='llm_pruner' cannot apply to model='tiny-mixtral' \(family 'moe'\)"):
        validate(compose_cfg(TINY_MC + ["model=tiny-mixtral", "pruner=llm_pruner", "calib=wikitext2"]))


def test_bad_options_are_refused_before_loading():
    with pytest.raises(ConfigError, match="taylor='second'"):
        validate(compose_cfg(TINY_MC + ["pruner=llm_pruner", "pruner.taylor=second", "calib=wikitext2"]))


# ---- export -------------------------------------------------------------------------------------

@pytest.fixture
def calib(calib_text) -> list[str]:
    return calib_text(3)


def test_export_reloads_to_the_same_predictions_and_stores_fewer_parameters(store, tmp_path, calib):
    from helpers.export import round_trip

    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters

    _, _, folder, pruning = round_trip("tiny-llama", ["pruner=llm_pruner", *calib], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    # 2 layers: the range maps to both, so every layer keeps the same widths and the config states them
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (2, 1, 64)
    assert not pruning["padded"]
    assert pruning["params_stored"] < count_parameters(get_model(compose_cfg(["model=tiny-llama"]).model).model)


# the range leaves layer 0 whole (4 heads in 2 key/value groups, 128 neurons) and halves layer 1
OUTSIDE_THE_RANGE = ["pruner=llm_pruner", "pruner.layer_range=index", "pruner.attention_layer_start=1",
                     "pruner.mlp_layer_start=1"]


def test_export_stores_the_layers_outside_the_range_whole_and_the_others_narrower(store, tmp_path, calib):
    from safetensors import safe_open
    from helpers.export import round_trip

    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters

    pruned, _, folder, pruning = round_trip("tiny-llama", [*OUTSIDE_THE_RANGE, *calib], tmp_path)
    after = pruning["structure"]["language"]["after"]
    assert [(layer["heads"], layer["kv_heads"], layer["neurons"]) for layer in after] == [(4, 2, 128), (2, 1, 64)]
    config = json.loads((folder / "config.json").read_text())
    # the config states the widest layer (the whole one); layer 1 is stored at its own widths
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (4, 2, 128)
    assert pruning["layout"] == "per_layer" and not pruning["padded"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    assert (shapes["model.layers.1.self_attn.k_proj.weight"], shapes["model.layers.1.mlp.up_proj.weight"]) == ((16, 64), (64, 64))
    assert shapes["model.layers.0.mlp.up_proj.weight"] == (128, 64)
    assert pruning["params_stored"] == pruned.data.metrics["params/total"]
    assert pruning["params_stored"] < count_parameters(get_model(compose_cfg(["model=tiny-llama"]).model).model)


def test_export_padded_is_a_stock_checkpoint_that_plain_transformers_loads(store, tmp_path, calib):
    from helpers.export import round_trip

    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters

    # round_trip reloads it through model=hf_causal, which reads a stock folder with from_pretrained
    _, _, folder, pruning = round_trip("tiny-llama", [*OUTSIDE_THE_RANGE, *calib, "export.padded=true"], tmp_path)
    assert pruning["layout"] == "stock" and pruning["padded"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert (attention.k_proj.out_features, mlp.up_proj.out_features) == (32, 128)  # padded to layer 0's widths
    assert not mlp.up_proj.weight[64:].any() and not attention.k_proj.weight[16:].any()
    # padded back to the widest layer, which the range left whole: the dense size
    assert pruning["params_stored"] == count_parameters(get_model(compose_cfg(["model=tiny-llama"]).model).model)


def test_a_layer_range_that_leaves_no_layer_is_refused_before_the_model_loads(tmp_path):
    """The release's indices (4..30) on tiny-llama's 2 layers: torch's "`inputs` argument to `grad()`
    cannot be empty" came after loading; now the range and the depth are named first."""
    text = tmp_path / "calib.txt"
    text.write_text("some calibration text " * 50)
    cfg = compose_cfg([*TINY_MC, "pruner=llm_pruner", "pruner.layer_range=index", "sparsity=0.3", "calib=file",
                       f"calib.path={text}"])
    with pytest.raises(ConfigError, match=r"layer_range=index: attention layers \[4, 30\) and MLP layers \[4, 30\) "
                                          r"leave none of the model's 2 layers to prune"):
        validate(cfg)
