"""The latency protocol on the CPU: exact counts, warm-ups excluded, exactly N tokens, greedy."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_MC, compose_cfg
from prunebench.bench.latency import GenerateBenchmark, GreedyDecoder, summarize, weight_bytes_per_token
from prunebench.job import run
from prunebench.models.tiny import load_tiny
from prunebench.validate import ConfigError, validate

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def test_decoder_generates_exactly_n_tokens_equal_to_hf_greedy():
    loaded = load_tiny(name="t", config=CONFIG, seed=2)
    prompt = torch.randint(0, 400, (1, 12), generator=torch.Generator().manual_seed(0))
    tokens, total, prefill = GreedyDecoder(loaded.model, 1, 12, 40, cuda_graph=True).generate(prompt)
    assert tokens.shape == (1, 40) and 0 < prefill < total
    reference = loaded.model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[:, 12:]
    assert torch.equal(tokens, reference)


def test_protocol_counts_forwards_and_excludes_warmups(monkeypatch):
    loaded = load_tiny(name="t", config=CONFIG, seed=2)
    calls = []
    loaded.model.register_forward_hook(lambda *a: calls.append(1))
    bench = GenerateBenchmark(prompt_tokens=12, new_tokens=128, warmup=2, runs=3)
    metrics, tags = bench.measure(loaded)
    assert len(calls) == (2 + 3) * 128  # one prefill + 127 decode steps per run, no early stop
    assert bench.last_tokens.shape == (1, 128)
    assert metrics["latency/p10_s"] <= metrics["latency/median_s"] <= metrics["latency/p90_s"]
    assert metrics["latency/floor_ratio"] == pytest.approx(
        metrics["latency/decode_per_token_s"] * 127 / metrics["latency/floor_s"])
    assert tags["bench.mode"] == "eager-static-cache" and tags["bench.protocol"].startswith("12 in / 128 out / bs 1")


@pytest.mark.parametrize(("name", "top_k", "experts"), [("tiny-mixtral", 2, 8), ("tiny-olmoe", 2, 8),
                                                     ("tiny-qwen2-moe", 2, 8)])
def test_moe_floor_reads_only_the_routed_experts(name, top_k, experts):
    from prunebench.models.cache import get_model
    from prunebench.models.experts import fused_experts

    model = get_model(compose_cfg([f"model={name}"]).model).model
    expert_bytes = sum(p.numel() * p.element_size() for m in model.modules() for p in fused_experts(m).values())
    everything = weight_bytes_per_token(model, experts_per_token=experts)  # as if every expert were read
    assert weight_bytes_per_token(model) == pytest.approx(everything - expert_bytes * (1 - top_k / experts))
    assert weight_bytes_per_token(model, 3.5) == pytest.approx(everything - expert_bytes * (1 - 3.5 / experts))
    if name == "tiny-mixtral":  # the measurement: every expert counted overstated the floor 2.4x
        assert everything / weight_bytes_per_token(model) == pytest.approx(2.4, abs=0.05)


def test_summary_statistics():
    got = summarize([5.0, 1.0, 2.0, 4.0, 3.0])
    assert got["median_s"] == 3.0 and got["mean_s"] == 3.0
    assert got["p10_s"] == pytest.approx(1.4) and got["p90_s"] == pytest.approx(4.6)


def test_weight_bytes_counts_a_tied_head_once_and_skips_an_untied_embedding():
    loaded = load_tiny(name="t", config=CONFIG, seed=2)
    params = sum(p.numel() * 4 for p in loaded.model.parameters())
    emb = loaded.model.get_input_embeddings().weight.numel() * 4
    assert weight_bytes_per_token(loaded.model) == params - emb  # llama: untied
    tied = load_tiny(name="t", config={**CONFIG, "tie_word_embeddings": True}, seed=2)
    assert weight_bytes_per_token(tied.model) == sum(p.numel() * 4 for p in tied.model.parameters())


def test_job_logs_latency_and_speedup_against_dense(store):
    bench = ["bench=llm_generate", "bench.warmup=1", "bench.runs=2", "bench.new_tokens=16"]
    dense = run(compose_cfg(TINY_MC + bench + ["pruner=none"]))
    pruned = run(compose_cfg(TINY_MC + bench + ["sparsity=0.5"]))
    assert dense["latency/speedup"] == 1.0
    assert pruned["latency/speedup"] > 0 and pruned["latency/floor_ratio"] > 0


def test_bench_is_checked_before_loading():
    with pytest.raises(ConfigError, match="bench='vision' cannot time model='tiny-llama'"):
        validate(compose_cfg(TINY_MC + ["bench=vision"]))
    with pytest.raises(ConfigError, match="new_tokens >= 2"):
        validate(compose_cfg(TINY_MC + ["bench=llm_generate", "bench.new_tokens=1"]))


def test_gpu_latency_script_runs_every_variant_on_cpu(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_latency.py"
    spec = importlib.util.spec_from_file_location("gpu_latency", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = script.main(["--shape", "tiny", "--device", "cpu", "--warmup", "0", "--runs", "1", "--new-tokens", "4"])
    assert [r["variant"] for r in rows] == ["dense", "layers -25%", "heads -25%", "width -25%", "2:4 sparse"]
    assert rows[0]["speedup"] == 1.0 and all(r["floor_ratio"] > 0 for r in rows)
    assert rows[-1]["note"] == "no 2:4 sparse kernels on cpu"
    assert "| heads -25% |" in capsys.readouterr().out


def test_bandwidth_is_measured_once_per_device_and_thread_count(monkeypatch):
    from prunebench.bench import environment

    environment.measured_bandwidth.cache_clear()
    sums = []
    monkeypatch.setattr(environment, "synchronize", sums.append)  # called once per sum of the buffer
    cpu = torch.device("cpu")
    first = environment.read_bandwidth(cpu)
    assert environment.read_bandwidth(cpu) == first and len(sums) == 6  # one warm-up + 5 timed, once
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert environment.read_bandwidth(cpu) > 0 and len(sums) == 12  # another thread count: measured again
    finally:
        torch.set_num_threads(threads)
