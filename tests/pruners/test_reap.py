"""REAP expert pruning against the released code (CerebrasResearch/reap: observer.py's
MoETransformerObserver as main.py sets it up, metrics.py's OnlineStatsTracker, prune.py's prune),
re-written step by step below on tiny MoE models of the four families, and the pruned model's
routing, validation, export and its composition with top-p routing."""

from __future__ import annotations

import copy
import json
import re

import mlflow
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from conftest import compose_cfg
from prunebench.job import run
from prunebench.pruners.reap import ReapPruner, saliency
from prunebench.pruners.routing import moe_routers
from prunebench.validate import ConfigError, validate
from helpers.export import TASK, round_trip

FAMILIES = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-olmoe"]
_MODELS: dict[str, object] = {}


class Windows:
    """A calibration source of fixed token windows."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def samples(self, tokenizer) -> torch.Tensor:
        return self.ids


def moe_blocks(model) -> dict[int, torch.nn.Module]:
    """observer.py hooks the MoE block class by name; its layer is the first number in the module's name."""
    return {int(re.search(r"\d+", name).group(0)): m for name, m in model.named_modules()
            if type(m).__name__.endswith("SparseMoeBlock")}


def expert_output(experts, e: int, x: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU MLP, unweighted, from its slices of the fused [gate; up] and down weights."""
    gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
    return F.linear(experts.act_fn(gate) * up, experts.down_proj[e])


class RunningMean:
    """metrics.py's OnlineStatsTracker.update: Welford's weighted mean with Kahan compensation, float32."""

    def __init__(self, n: int):
        self.count = torch.zeros(n, dtype=torch.long)
        self.mean, self.compensation = torch.zeros(n), torch.zeros(n)

    def update(self, new_mean: torch.Tensor, new_count: torch.Tensor) -> None:
        updated = self.count + new_count
        y = ((new_mean - self.mean) * new_count / updated).nan_to_num(0) - self.compensation
        t = self.mean + y
        self.compensation = (t - self.mean) - y
        self.mean, self.count = t, updated


@torch.no_grad()
def released_observer(model, ids: torch.Tensor) -> dict[int, dict]:
    """observer.py's hook with record_pruning_metrics_only, over one sample per forward (batch size 1,
    no padding). main._setup_observer renormalises only where config.norm_topk_prob is set (and its
    renormalize_router_weights flag, default true). In transformers 5 a MoE block returns its hidden
    states alone, so the router logits the release reads from the block's output are recomputed
    from its input here (the four routers are a bias-free linear map)."""
    renormalize = bool(getattr(model.config, "norm_topk_prob", False))
    state, handles = {}, []

    def factory(layer, block):
        num_experts, top_k = block.gate.num_experts, block.gate.top_k

        def hook(module, args, output):
            flat = args[0].reshape(-1, args[0].shape[-1])
            router_logits = F.linear(flat, block.gate.weight)
            selected = torch.topk(router_logits, top_k, dim=-1).indices
            activations = torch.zeros((num_experts, *flat.shape))
            for idx in range(num_experts):
                activations[idx] = expert_output(block.experts, idx, flat)
            frequency = torch.bincount(selected.view(-1), minlength=num_experts)
            layer_state = state.setdefault(layer, {"expert_frequency": torch.zeros(num_experts, dtype=torch.long),
                                                   "reap": RunningMean(num_experts)})
            layer_state["expert_frequency"] += frequency
            weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            if renormalize:
                weights = weights / torch.gather(weights, 1, selected).sum(dim=-1, keepdim=True)
                weights = torch.clamp(weights, min=torch.finfo(weights.dtype).eps)
            reap = torch.zeros(num_experts)
            for i in range(num_experts):
                active = (selected == i).any(dim=-1)
                if not active.any():
                    continue
                norms = torch.linalg.norm(activations[i, active, :], dim=-1)
                reap[i] = (norms * weights[active, i]).mean()
            layer_state["reap"].update(reap, frequency)

        return hook

    for layer, block in moe_blocks(model).items():
        handles.append(block.register_forward_hook(factory(layer, block)))
    try:
        for row in ids:
            model(input_ids=row[None])
    finally:
        for handle in handles:
            handle.remove()
    return {layer: {"reap": s["reap"].mean, "frequency": s["expert_frequency"]} for layer, s in state.items()}


def released_kept(saliency_data: torch.Tensor, ratio: float) -> list[int]:
    """prune.py: int(total * compression_ratio) experts with the lowest saliency (torch.topk, CPU)."""
    n = saliency_data.shape[0]
    to_prune = torch.topk(saliency_data, int(n * ratio), largest=False).indices
    return [i for i in range(n) if i not in to_prune]


def fixture_model(name: str):
    """A tiny MoE model whose routing is spread (routers scaled up) and whose most often routed
    experts are made quiet (their down projections scaled by 0.05): frequency would keep exactly the
    experts REAP removes first."""
    if name not in _MODELS:
        loaded = instantiate(compose_cfg([f"model={name}"]).model, _convert_="all")
        ids = calibration_ids(loaded)
        with torch.no_grad():
            for block in moe_blocks(loaded.model).values():
                block.gate.weight *= 4
            for layer, block in moe_blocks(loaded.model).items():
                busiest = torch.argsort(released_observer(loaded.model, ids)[layer]["frequency"], descending=True)[:3]
                block.experts.down_proj[busiest] *= 0.05
        _MODELS[name] = loaded
    return copy.deepcopy(_MODELS[name])


def calibration_ids(loaded) -> torch.Tensor:
    return torch.randint(3, len(loaded.tokenizer), (4, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", FAMILIES)
def test_scores_and_kept_experts_are_the_released_codes(name, one_thread):
    loaded = fixture_model(name)
    ids = calibration_ids(loaded)
    reference = released_observer(loaded.model, ids)
    ours = ReapPruner().score(loaded, Windows(ids))
    assert sorted(ours) == sorted(reference)
    for layer, released in reference.items():
        # float32 running means against float64 sums over a hundred tokens: a few float32 ulps apart
        torch.testing.assert_close(saliency(ours[layer], "reap"), released["reap"], rtol=1e-5, atol=1e-8)
        assert torch.equal(saliency(ours[layer], "frequency"), released["frequency"])
    for ratio in (0.25, 0.5):
        kept = {layer: released_kept(r["reap"], ratio) for layer, r in reference.items()}
        # the fixture makes the unweighted frequency keep other experts than REAP in some layer
        assert kept != {layer: released_kept(r["frequency"], ratio) for layer, r in reference.items()}
        for score in ("reap", "frequency"):
            pruned = copy.deepcopy(loaded)
            original = {layer: router.weight.clone() for layer, router in moe_routers(pruned.model).items()}
            stats = ReapPruner(score=score).apply(pruned, ours, ratio)
            assert stats["sparsity/actual"] == ratio
            for layer, router in moe_routers(pruned.model).items():
                expected = released_kept(reference[layer][score], ratio)
                assert torch.equal(router.weight, original[layer][expected]), (score, layer)
                assert score == "frequency" or expected == kept[layer]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_pruned_model_routes_top_k_over_the_experts_left(name, one_thread):
    """Equal to the unpruned model with the removed experts' router logits at -inf."""
    loaded = fixture_model(name)
    ids = calibration_ids(loaded)
    pruned = copy.deepcopy(loaded)
    original = {layer: router.weight.clone() for layer, router in moe_routers(pruned.model).items()}
    ReapPruner().apply(pruned, ReapPruner().score(loaded, Windows(ids)), 0.5)
    config = pruned.model.config
    assert getattr(config, "num_local_experts", None) or config.num_experts == 4

    def masked(router, removed):
        def hook(module, args, output):
            logits = output[0].masked_fill(removed, float("-inf"))
            probs = torch.softmax(logits.float(), dim=-1)
            weights, experts = torch.topk(probs, module.top_k, dim=-1)
            if getattr(module, "norm_topk_prob", True):  # Mixtral always rescales
                weights = weights / weights.sum(-1, keepdim=True)
            return output[0], weights.to(output[1].dtype), experts
        return hook

    for layer, router in moe_routers(loaded.model).items():
        kept_rows = moe_routers(pruned.model)[layer].weight
        removed = ~(original[layer][:, None, :] == kept_rows[None]).all(-1).any(-1)
        assert int(removed.sum()) == 4
        router.register_forward_hook(masked(router, removed))
    with torch.no_grad():
        # the same experts' outputs summed in another order: float32 rounding only
        torch.testing.assert_close(pruned.model(ids).logits, loaded.model(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("overrides", "message"), [
    (["sparsity=0.9"], "leaving 1, fewer than the 2 each token is routed to"),
    (["pruner.score=weighted"], "pruner.score='weighted' is not one of"),
    (["model=tiny-llama"], "cannot apply to model='tiny-llama'"),
])
def test_impossible_settings_are_refused_before_the_model_loads(overrides, message, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("the quick brown fox " * 50)
    cfg = compose_cfg(["model=tiny-mixtral", *TASK, "pruner=reap", "sparsity=0.5", "calib=file",
                       f"calib.path={text}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(cfg)


@pytest.fixture
def calib(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. Question: What is the capital of France? " * 30)
    return ["calib=file", f"calib.path={text}", "calib.n_samples=2", "calib.seq_len=16"]


def test_export_states_fewer_experts_and_reloads_to_the_same_predictions(store, tmp_path, calib):
    pruned, _, folder, pruning = round_trip("tiny-qwen3-moe", ["pruner=reap", "sparsity=0.25", *calib], tmp_path,
                                            family="moe")
    config = json.loads((folder / "config.json").read_text())
    assert config.get("num_local_experts", config.get("num_experts")) == 6  # transformers 5's key for num_experts
    assert pruning["achieved"]["experts/per_layer"] == 6
    assert pruned.data.metrics["sparsity/params"] > 0


def test_frequency_shares_reaps_scoring_and_top_p_composes(store, calib):
    base = ["model=tiny-olmoe", *TASK, "tracking.ensure_dense=false", "limit=2", "sparsity=0.5", *calib]
    run(compose_cfg([*base, "pruner=reap"]))
    run(compose_cfg([*base, "pruner=reap", "pruner.score=frequency"]))
    run(compose_cfg([*base, "pruner=reap_topp", "pruner.threshold=0.3"]))
    names = {r.data.tags["prunebench.pruner"]: r for r in mlflow.search_runs(experiment_names=["prunebench"],
                                                                           output_format="list")}
    assert names["experts_frequency"].data.tags["prunebench.score_cache"] == "hit"
    topp = names["experts_reap_topp_p0.3"]
    assert topp.data.metrics["experts/per_layer"] == 4
    assert "top-p routing with p=0.3" in topp.data.tags["prunebench.routing"]
    assert 1 <= topp.data.metrics["local_mc/experts_per_token"] <= 4
    with pytest.raises(ConfigError, match="not its weights"):
        validate(compose_cfg([*base, "pruner=reap_topp", "export=hf"]))


def test_a_sparsity_that_removes_what_another_removes_is_recorded_and_keyed_as_it(tmp_path, caplog):
    """int(8 x 0.8) = 6 experts, as int(8 x 0.75): one model, so one run key and one recorded sparsity."""
    from prunebench.inputs import job_inputs
    from prunebench.pruning import key_by_removed
    from prunebench.tracking.run_key import run_key

    text = tmp_path / "calib.txt"
    text.write_text("the quick brown fox " * 50)
    keys = {}
    for ratio in ("0.75", "0.8"):
        cfg = compose_cfg(["model=tiny-mixtral", *TASK, "pruner=reap", f"sparsity={ratio}", "calib=file",
                           f"calib.path={text}", "calib.seq_len=64"])
        tasks = validate(cfg)
        key_by_removed(cfg)  # as the job, the plan and the SLURM launcher key it
        keys[ratio] = run_key(cfg, job_inputs(cfg, tasks))
        assert cfg.sparsity == 0.75
    assert keys["0.75"] == keys["0.8"]
    assert "sparsity=0.8 removes what sparsity=0.75 removes on model=tiny-mixtral" in caplog.text
