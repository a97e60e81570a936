"""Dynamic expert routing on tiny random MoE models of the four supported families."""

from __future__ import annotations

import copy
import json
import math

import mlflow
import pytest
import torch
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient

from conftest import MC_FIXTURE, compose_cfg, reordered
from prunebench.evaluation.generation.greedy import Generator
from prunebench.evaluation.loglikelihood.scorer import common_prefix_len, score_documents
from prunebench.job import run
from prunebench.pruners.routing import TopKRouting, TopPRouting, moe_routers
from prunebench.validate import ConfigError, validate

FAMILIES = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-olmoe"]
_MODELS: dict[str, object] = {}


def tiny(name: str, router_scale: float = 1.0):
    """A fresh copy of a tiny MoE model. Random routers are nearly uniform; scaled up, their
    probabilities spread so top-p keeps anything from one expert to all of them."""
    if name not in _MODELS:
        _MODELS[name] = instantiate(compose_cfg([f"model={name}"]).model, _convert_="all")
    loaded = copy.deepcopy(_MODELS[name])
    with torch.no_grad():
        for router in moe_routers(loaded.model).values():
            router.weight *= router_scale
    return loaded


def batch(loaded, rows: int = 3, length: int = 11, seed: int = 0):
    """Random token rows, left-padded by different amounts (the padding masked)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(loaded.tokenizer), (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : 2 * row] = 0
    return ids, mask


def logits(loaded, ids, mask):
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        return loaded.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits


def real_logits(out, mask):
    return out[mask.bool()]


def expert_mlp(experts, e: int, x: torch.Tensor) -> torch.Tensor:
    gate, up = (experts.gate_up_proj[e] @ x).chunk(2)
    return experts.down_proj[e] @ (experts.act_fn(gate) * up)


def reference_block(block, hidden: torch.Tensor, threshold: float, used: list[int]) -> torch.Tensor:
    """The paper's rule one token at a time: sort the router's softmax, keep experts until the
    running sum first exceeds the threshold, sum their outputs weighted by the raw probabilities."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = torch.zeros_like(flat)
    for t, x in enumerate(flat):
        probs = torch.softmax(block.gate.weight @ x, dim=-1).tolist()
        total, kept = 0.0, 0
        for e in sorted(range(len(probs)), key=lambda i: (-probs[i], i)):
            out[t] += probs[e] * expert_mlp(block.experts, e, x)
            total, kept = total + probs[e], kept + 1
            if total > threshold:
                break
        used.append(kept)
        if hasattr(block, "shared_expert"):
            out[t] += torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return out.reshape(hidden.shape)


@pytest.mark.parametrize("name", FAMILIES)
def test_native_topk_reproduces_the_unmodified_model_exactly(name):
    dense = tiny(name, router_scale=20.0)
    ids, mask = batch(dense)
    expected = logits(dense, ids, mask)
    native_k = next(iter(moe_routers(dense.model).values())).top_k
    pruner = TopKRouting("moe_topk", k=native_k)
    pruner.apply(dense, None, 0.5)
    pruner.start_task("t")
    assert torch.equal(logits(dense, ids, mask), expected)
    metrics = pruner.task_metrics("t")
    assert metrics["t/experts_per_token"] == native_k
    assert metrics["t/active_params_vs_topk"] == 1.0


@pytest.mark.parametrize("name", FAMILIES)
def test_top_p_matches_a_per_token_reference_and_telemetry_counts_match(name):
    threshold = 0.6
    pruned, reference = tiny(name, router_scale=20.0), tiny(name, router_scale=20.0)
    ids, mask = batch(pruned)
    used: dict[int, list[int]] = {}
    for layer, router in moe_routers(reference.model).items():
        block = next(m for m in reference.model.modules() if getattr(m, "gate", None) is router)
        used[layer] = []
        block.register_forward_hook(
            lambda m, args, out, layer=layer: reference_block(m, args[0], threshold, used[layer]))
    expected = logits(reference, ids, mask)

    pruner = TopPRouting("moe_topp", threshold=threshold)
    pruner.apply(pruned, None, 0.5)
    pruner.start_task("t")
    out = logits(pruned, ids, mask)
    want = real_logits(expected, mask)
    # the same experts summed fused vs per token, 3 layers at most
    torch.testing.assert_close(real_logits(out, mask), want, **reordered(want, depth=3))

    real = mask.reshape(-1).bool().tolist()
    metrics = pruner.task_metrics("t")
    table = pruner.task_artifacts("t")["routing/t.json"]
    spread = set()
    for layer, counts in used.items():
        counts = [c for c, r in zip(counts, real) if r]
        spread |= set(counts)
        assert metrics[f"t/experts_per_token/layer_{layer}"] == pytest.approx(sum(counts) / len(counts))
        histogram = {str(n): counts.count(n) for n in range(1, 9)}
        assert table["layers"][str(layer)]["tokens_by_experts_used"] == histogram
    assert table["tokens"] == sum(real)
    assert len(spread) >= 3, "the scaled routers should make tokens keep different numbers of experts"
    means = [metrics[f"t/experts_per_token/layer_{layer}"] for layer in used]
    assert metrics["t/experts_per_token"] == pytest.approx(sum(means) / len(means))


@pytest.mark.parametrize("name", FAMILIES)
def test_top_p_close_to_one_uses_all_experts(name):
    loaded = tiny(name, router_scale=5.0)
    ids, mask = batch(loaded)
    pruner = TopPRouting("moe_topp", threshold=0.99999)
    pruner.apply(loaded, None, 0.5)
    pruner.start_task("t")
    logits(loaded, ids, mask)
    metrics = pruner.task_metrics("t")
    layers = moe_routers(loaded.model)
    assert all(metrics[f"t/experts_per_token/layer_{layer}"] == 8 for layer in layers)
    assert metrics["t/experts_per_token"] == 8
    # every expert of every layer runs for every token: all parameters are active
    assert metrics["t/active_params_frac"] == pytest.approx(1.0)
    assert metrics["t/active_params_vs_topk"] > 1


def test_renormalized_top_p_weights_sum_to_one_and_counts_reset_per_task():
    loaded = tiny("tiny-olmoe", router_scale=20.0)
    ids, mask = batch(loaded)
    pruner = TopPRouting("moe_topp", threshold=0.5, renormalize=True)
    pruner.apply(loaded, None, 0.5)
    seen = []
    router = next(iter(moe_routers(loaded.model).values()))
    router.register_forward_hook(lambda m, args, out: seen.append(out[1].sum(-1)))
    pruner.start_task("a")
    logits(loaded, ids, mask)
    torch.testing.assert_close(seen[0], torch.ones_like(seen[0]))  # a sum of <= 8 fp32 weights
    pruner.start_task("b")
    logits(loaded, ids[:1], mask[:1])
    # task b counts its own tokens only
    assert pruner.task_artifacts("b")["routing/b.json"]["tokens"] == int(mask[0].sum())


def test_only_real_tokens_of_a_scored_batch_are_counted():
    """score_documents pads prefixes on the left and suffixes on the right; neither is counted."""
    loaded = tiny("tiny-mixtral")
    tok = loaded.tokenizer

    class Doc:
        def __init__(self, context, choices):
            self.inputs = [tok.encode(context + c) for c in choices]
            self.conts = [tok.encode(c, add_special_tokens=False) for c in choices]
            self.cont_lens = [len(c) for c in self.conts]

    docs = [Doc("Question: How many legs do horses have?\nAnswer:", [" two", " four", " six legs in total"]),
            Doc("A", [" B", " C D E"])]
    pruner = TopKRouting("moe_topk", k=1)
    pruner.apply(loaded, None, 0.5)
    pruner.start_task("t")
    score_documents(loaded, docs)
    shared = [common_prefix_len(d.inputs) for d in docs]
    tokens = sum(shared) + sum(len(seq) - n for d, n in zip(docs, shared) for seq in d.inputs)
    assert pruner.task_artifacts("t")["routing/t.json"]["tokens"] == tokens


class Requests:
    """One document's requests as the scorer reads them, from token lists (`inputs[i]` fed whole,
    its last `cont_lens[i]` tokens scored)."""

    def __init__(self, inputs: list[list[int]], cont_len: int = 2):
        self.inputs, self.cont_lens = inputs, [cont_len] * len(inputs)
        self.conts = [seq[-cont_len:] for seq in inputs]


def histogram(pruner, task: str) -> dict:
    return {layer: row["tokens_by_experts_used"] for layer, row in
            pruner.task_artifacts(task)["routing/" + task + ".json"]["layers"].items()}


def summed(histograms: list[dict]) -> dict:
    out: dict = {}
    for h in histograms:
        for layer, counts in h.items():
            for n, c in counts.items():
                out.setdefault(layer, {}).setdefault(n, 0)
                out[layer][n] += c
    return out


def test_documents_without_a_shared_prefix_count_their_real_tokens_as_when_scored_alone():
    """Choices that differ from their first token run right-padded with no mask (causal, so the
    scores need none); the padding must still not be counted: the batch's histogram is the sum of
    each document's alone."""
    loaded = tiny("tiny-olmoe", router_scale=20.0)
    gen = torch.Generator().manual_seed(1)
    docs = [Requests([torch.randint(3, len(loaded.tokenizer), (n,), generator=gen).tolist() for n in lengths])
            for lengths in ([9, 4, 6], [3, 8])]
    assert all(common_prefix_len(d.inputs) == 0 for d in docs)
    pruner = TopPRouting("moe_topp", threshold=0.6)
    pruner.apply(loaded, None, 0.5)
    alone = []
    for i, doc in enumerate(docs):
        pruner.start_task(f"alone{i}")
        score_documents(loaded, [doc])
        alone.append(histogram(pruner, f"alone{i}"))
    pruner.start_task("t")
    score_documents(loaded, docs)
    assert pruner.task_artifacts("t")["routing/t.json"]["tokens"] == sum(len(s) for d in docs for s in d.inputs)
    assert histogram(pruner, "t") == summed(alone)


def test_a_shared_context_counts_once_per_option_under_opencompass_and_the_scores_do_not_move():
    loaded = tiny("tiny-mixtral")
    gen = torch.Generator().manual_seed(2)
    context = torch.randint(3, len(loaded.tokenizer), (12,), generator=gen).tolist()
    doc = Requests([context + torch.randint(3, len(loaded.tokenizer), (n,), generator=gen).tolist() for n in (2, 3, 5)])
    pruner = TopKRouting("moe_topk", k=1)
    pruner.apply(loaded, None, 0.5)
    pruner.start_task("once")
    once = score_documents(loaded, [doc])
    assert pruner.task_artifacts("once")["routing/once.json"]["tokens"] == 12 + 2 + 3 + 5
    pruner.start_task("per_option")
    assert score_documents(loaded, [doc], context_per_option=True) == once
    assert pruner.task_artifacts("per_option")["routing/per_option.json"]["tokens"] == 3 * 12 + 2 + 3 + 5


def test_the_lm_head_probe_is_no_task_token():
    loaded = tiny("tiny-qwen2-moe")
    pruner = TopKRouting("moe_topk", k=1)
    pruner.apply(loaded, None, 0.5)
    pruner.start_task("t")
    loaded.check_lm_head()
    assert pruner.task_artifacts("t")["routing/t.json"]["tokens"] == 0


def test_generation_counts_rows_only_until_they_finish():
    """Rows that stop early are fed padding under a mask of ones until the batch stops: a batch
    counts what each prompt counts alone, its prompt and the tokens it generated before its last."""
    loaded = tiny("tiny-mixtral", router_scale=20.0)
    tok = loaded.tokenizer
    prompts = [tok.encode(text) for text in ("The quick brown fox", "Question: What is", "How many legs do horses")]
    with torch.no_grad():
        outs = [loaded.model.generate(input_ids=torch.tensor([p]), max_new_tokens=10, do_sample=False,
                                      pad_token_id=tok.pad_token_id)[0, len(p):].tolist() for p in prompts]
    # an EOS id that ends some rows early and others later (or never)
    firsts = {t: tuple(out.index(t) + 1 if t in out else len(out) for out in outs)
              for t in {t for out in outs for t in out}}
    eos, ends = max(firsts.items(), key=lambda kv: (len(set(kv[1])), -min(kv[1])))
    assert len(set(ends)) >= 2 and min(ends) < 10, ends
    loaded.model.generation_config.eos_token_id = eos
    generator = Generator(loaded, until=[], max_new_tokens=10)
    pruner = TopPRouting("moe_topp", threshold=0.6)
    pruner.apply(loaded, None, 0.5)
    alone = []
    for i, prompt in enumerate(prompts):
        pruner.start_task(f"alone{i}")
        generator([prompt])
        alone.append(histogram(pruner, f"alone{i}"))
        assert pruner.task_artifacts(f"alone{i}")[f"routing/alone{i}.json"]["tokens"] == len(prompt) + ends[i] - 1
    pruner.start_task("t")
    generator(prompts)
    assert pruner.task_artifacts("t")["routing/t.json"]["tokens"] == sum(len(p) + n - 1 for p, n in zip(prompts, ends))
    assert histogram(pruner, "t") == summed(alone)


def test_unsupported_models_and_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="model types .*mixtral.*; this model is 'llama'"):
        TopPRouting("moe_topp", threshold=0.4).apply(
            instantiate(compose_cfg(["model=tiny-llama"]).model, _convert_="all"), None, 0.5)
    with pytest.raises(ConfigError, match="family 'causal_lm'"):
        validate(compose_cfg(["model=tiny-llama", "pruner=moe_topp", "task=local_mc",
                              f"task.tasks.local_mc.source.path={MC_FIXTURE}"]))
    for override in ["pruner.threshold=1.5", "pruner.threshold=-0.1"]:
        with pytest.raises(ConfigError, match="threshold"):
            validate(compose_cfg(["model=tiny-olmoe", "pruner=moe_topp", override, "task=local_mc",
                                  f"task.tasks.local_mc.source.path={MC_FIXTURE}"]))
    with pytest.raises(ConfigError, match="pruner.k"):
        validate(compose_cfg(["model=tiny-olmoe", "pruner=moe_topk", "pruner.k=0", "task=local_mc",
                              f"task.tasks.local_mc.source.path={MC_FIXTURE}"]))
    with pytest.raises(ValueError, match="exceeds the model's 8 experts"):
        TopKRouting("moe_topk", k=9).apply(tiny("tiny-olmoe"), None, 0.5)


def test_threshold_sweep_jobs_log_telemetry_and_stability_against_native_routing(store):
    base = ["model=tiny-qwen2-moe", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
            "trainer.enable_progress_bar=false", "pruner=moe_topp"]
    results = {p: run(compose_cfg(base + [f"pruner.threshold={p}"])) for p in (0.3, 0.9)}
    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])
    assert list(runs["tags.prunebench.pruner"]) == ["none", "moe_topp_p0.3", "moe_topp_p0.9"]
    dense = runs.iloc[0]
    for (p, metrics), (_, job) in zip(results.items(), runs.iloc[1:].iterrows()):
        assert 1 <= metrics["local_mc/experts_per_token"] <= 8
        assert {"local_mc/experts_per_token/layer_0", "local_mc/experts_per_token/layer_2"} <= set(metrics)
        assert "local_mc/experts_per_token/layer_1" not in metrics  # a dense MLP block
        assert 0 < metrics["local_mc/active_params_frac"] <= 1
        assert metrics["stability/local_mc"] == pytest.approx(
            100 * metrics["local_mc/acc_norm"] / dense["metrics.local_mc/acc_norm"])
        assert "top-p routing with p=" in job["tags.prunebench.routing"]
        client = MlflowClient(store)
        arts = {a.path for a in client.list_artifacts(job.run_id, "routing")}
        assert arts == {"routing/local_mc.json", "routing/local_mc.png"}
        table = json.load(open(client.download_artifacts(job.run_id, "routing/local_mc.json")))
        assert table["layers"]["0"]["experts_per_token"] == pytest.approx(
            metrics["local_mc/experts_per_token/layer_0"])
    assert results[0.3]["local_mc/experts_per_token"] < results[0.9]["local_mc/experts_per_token"]
    assert math.isnan(dense["metrics.local_mc/experts_per_token"])  # native routing: nothing observed
