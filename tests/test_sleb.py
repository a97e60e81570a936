"""SLEB: the greedy block order equals the released loop's (jiwonsong-dev/SLEB, sleb.py), run here
step by step with a whole forward per candidate; the blocks are cut out, and the export reloads."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import TINY_MC, compose_cfg
from prunebench.models.introspection import count_parameters, transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.sleb import SLEBPruner, greedy_order
from prunebench.validate import ConfigError, validate

SEQLEN = 16


def decoder(model_type: str = "llama", layers: int = 6, seed: int = 5) -> AutoModelForCausalLM:
    """Weights drawn 10x wider than the default init, so every block changes the loss by percents:
    the candidates' losses lie far apart (no near-tie that rounding could flip). With this seed the
    greedy order is not a one-shot ranking of the first round's losses, nor the last blocks."""
    torch.manual_seed(seed)
    extra = {}
    if model_type == "gemma3_text":
        extra = dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    config = AutoConfig.for_model(model_type, num_hidden_layers=layers, vocab_size=97, hidden_size=32,
                                  intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                                  initializer_range=0.2, **extra)
    return AutoModelForCausalLM.from_config(config).eval()


def loaded(model) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, name="tiny", family="causal_lm", max_length=64)


class Windows:
    def samples(self, tokenizer):
        return torch.randint(3, 97, (2, SEQLEN), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def released_loss(model, stream: torch.Tensor) -> float:
    """sleb.py's get_loss: the token stream cut into seqlen windows, each run whole (bs=1), its mean
    next-token cross-entropy times seqlen, summed."""
    total = []
    for w in range(stream.numel() // SEQLEN):
        inputs = stream[:, w * SEQLEN:(w + 1) * SEQLEN]
        logits = model(inputs).logits
        loss = nn.CrossEntropyLoss()(logits[:, :-1].reshape(-1, logits.shape[-1]), inputs[:, 1:].reshape(-1))
        total.append(loss.float() * SEQLEN)
    return torch.stack(total).sum().item()


def released_sleb(model, stream: torch.Tensor, num_remove: int, early: int = 1, latter: int = 1):
    """sleb.py's loop: each phase turns each candidate block off in turn (its on/off layer returns
    its input), scores the whole model, keeps the strictly lowest loss, then turns the winner off for
    good. Returns the removal list and every phase's candidate losses."""
    _, blocks = transformer_blocks(model)
    num_blocks = len(blocks)
    alive, removal, phases = list(range(num_blocks)), [], []

    def turn_off(i):
        blocks[i].forward = lambda hidden, *args, **kwargs: hidden

    def turn_on(i):
        del blocks[i].forward

    for i in range(num_remove):
        min_loss, min_idx, losses = 1e99, -1, []
        for j in range(early, num_blocks - i - latter):
            turn_off(alive[j])
            loss = released_loss(model, stream)
            losses.append(loss)
            if loss < min_loss:
                min_loss, min_idx = loss, j
            turn_on(alive[j])
        turn_off(alive[min_idx])
        removal.append(alive[min_idx])
        phases.append(losses)
        del alive[min_idx]
    for i in removal:
        turn_on(i)
    return removal, phases


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_greedy_order_is_the_released_loops(model_type, one_thread):
    model = decoder(model_type)
    want, phases = released_sleb(model, Windows().samples(None).reshape(1, -1), 3)
    got = SLEBPruner(max_fraction=0.5).score(loaded(model), Windows())
    assert got["order"].tolist() == want
    if model_type == "llama":  # the fixture is one that only greedy re-evaluation gets right
        one_shot = [1 + k for k in sorted(range(len(phases[0])), key=phases[0].__getitem__)][:3]
        assert set(one_shot) != set(want) and set(want) != {2, 3, 4}  # {1, 2, 4}
    # our summed NLL after each removal is the released loss up to its seqlen / (seqlen - 1) scaling
    # (fp32 sums in another order, over 2 windows: well inside 1e-5)
    released = [min(losses) * (SEQLEN - 1) / SEQLEN for losses in phases]
    assert got["nll"].tolist() == pytest.approx(released, rel=1e-5)


def test_apply_cuts_the_first_blocks_of_the_order_rounded_up(one_thread):
    model = decoder()
    reference = decoder()
    pruner = SLEBPruner(max_fraction=0.5)
    lm = loaded(model)
    scores = pruner.score(lm, Windows())
    stats = pruner.apply(lm, scores, 0.3)  # ceil(6 x 0.3) = 2 blocks
    drop = scores["order"][:2].tolist()
    assert model.config.num_hidden_layers == 4 and stats["sparsity/actual"] == 2 / 6
    assert stats["sparsity/params"] > 0 and stats["sparsity/flops"] > 0
    for i in drop:
        transformer_blocks(reference)[1][i].forward = lambda hidden, *args, **kwargs: hidden
    ids = Windows().samples(None)
    with torch.no_grad():
        # the same blocks on the same inputs, skipped or removed: the same kernels, bit for bit
        assert torch.equal(model(ids).logits, reference(ids).logits)
    tokens = 2 * (SEQLEN - 1)
    assert stats["sleb/calib_ppl"] == pytest.approx(math.exp(released_loss(reference, ids.reshape(1, -1))
                                                             * (SEQLEN - 1) / SEQLEN / tokens), rel=1e-5)


def test_block_count_rounds_up_as_the_release():
    pruner = SLEBPruner()
    # README: 16 of Llama-2-70B's 80 blocks at 20%; sleb.py's defaults: 7 of 32; latency.py: ceil(L x ratio)
    assert [pruner.count(80, 0.2), pruner.count(32, 0.2), pruner.count(10, 0.3), pruner.count(6, 0.5)] == [16, 7, 3, 3]


def test_barriers_bound_what_can_be_removed(one_thread):
    lm = loaded(decoder(layers=4))
    batches = [{"input_ids": Windows().samples(None)[:1]}]
    order, _ = greedy_order(lm, batches, 2)
    assert set(order) == {1, 2}  # the first and last remaining blocks are never candidates
    with pytest.raises(ValueError, match="at most 2 of 4 blocks"):
        greedy_order(lm, batches, 3)


def test_ties_go_to_the_earliest_block_as_the_releases_strict_less_than(one_thread):
    model = decoder()
    with torch.no_grad():  # blocks 1-4 add nothing to the residual stream: removing any gives the same loss
        for layer in model.model.layers[1:5]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    want, phases = released_sleb(model, Windows().samples(None).reshape(1, -1), 3)
    assert all(len(set(losses)) == 1 for losses in phases) and want == [1, 2, 3]
    assert SLEBPruner().score(loaded(model), Windows())["order"].tolist() == want


def test_more_blocks_than_the_barriers_leave_is_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match="removes 1 of its 2 blocks.*so at most 0"):
        validate(compose_cfg(TINY_MC + ["pruner=sleb", "sparsity=0.2", "calib=wikitext2"]))


@pytest.mark.parametrize(("model", "family"), [("tiny-llava", "vlm"), ("tiny-mixtral", "moe")])
def test_unsupported_family_is_refused_before_the_model_loads(model, family):
    cfg = compose_cfg(TINY_MC + [f"model={model}", "pruner=sleb", "calib=wikitext2"])
    with pytest.raises(ConfigError, match=f"pruner='sleb' cannot apply to model='{model}' \\(family '{family}'\\)"):
        validate(cfg)


def test_sparsity_beyond_the_scored_fraction_is_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match="raise pruner.max_fraction"):
        validate(compose_cfg(TINY_MC + ["pruner=sleb", "pruner.max_fraction=0.3", "sparsity=0.4"]))


@pytest.fixture
def calib(calib_text) -> list[str]:
    return calib_text(2)


def test_export_reloads_to_the_same_predictions_with_fewer_parameters(store, tmp_path, calib):
    from helpers.export import round_trip

    from prunebench.models.cache import get_model

    four = "model.config.num_hidden_layers=4"  # tiny-llama's 2 blocks are both behind the barriers
    _, _, folder, pruning = round_trip("tiny-llama", ["pruner=sleb", four, *calib], tmp_path)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    assert pruning["structure"]["layers_before"] == 4 and len(pruning["structure"]["layers_removed"]) == 2
    dense = get_model(compose_cfg(["model=tiny-llama", four]).model).model
    block = count_parameters(transformer_blocks(dense)[1][0])
    assert pruning["params_stored"] == count_parameters(dense) - 2 * block
