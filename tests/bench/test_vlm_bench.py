"""bench=vlm_generate on tiny-llava: one image and a prompt, exactly N greedy tokens equal to
transformers' own generate, the floor over the bytes a decode step reads, logged by a job."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_cfg
from prunebench.bench.vlm import VisionLanguageGenerateBenchmark, part_bytes
from prunebench.bench.latency import weight_bytes_per_token
from prunebench.job import run
from prunebench.models.cache import get_model
from prunebench.validate import ConfigError, validate


@pytest.fixture(scope="module")
def tiny_llava():
    return get_model(compose_cfg(["model=tiny-llava"]).model)


def test_tokens_equal_greedy_generate_with_the_image(tiny_llava):
    bench = VisionLanguageGenerateBenchmark(new_tokens=10, warmup=1, runs=2)
    calls = []
    handle = tiny_llava.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        metrics, tags = bench.measure(tiny_llava)
    finally:
        handle.remove()
    assert len(calls) == (1 + 2) * 10  # one prefill + 9 decode steps per run, no early stop
    inputs = bench.prompt_inputs(tiny_llava)
    assert inputs["pixel_values"].shape[0] == 1 and (inputs["input_ids"] == tiny_llava.model.config.image_token_index).sum() == 16
    reference = tiny_llava.model.generate(**inputs, max_new_tokens=10, min_new_tokens=10, do_sample=False,
                                          eos_token_id=None, pad_token_id=0)[:, inputs["input_ids"].shape[1]:]
    assert torch.equal(bench.last_tokens, reference)
    assert metrics["latency/p10_s"] <= metrics["latency/median_s"] <= metrics["latency/p90_s"]
    assert metrics["latency/floor_ratio"] == pytest.approx(metrics["latency/decode_per_token_s"] * 9 / metrics["latency/floor_s"])
    assert tags["bench.protocol"] == f"1 image + prompt = {inputs['input_ids'].shape[1]} in / 10 out / bs 1 / 1 warm-up / 2 timed"


def test_the_image_reaches_the_prefill(tiny_llava, tmp_path):
    from PIL import Image

    random_picture = VisionLanguageGenerateBenchmark(new_tokens=6, warmup=0, runs=1)
    random_picture.measure(tiny_llava)
    Image.new("RGB", (30, 20), (255, 0, 0)).save(tmp_path / "red.png")
    red = VisionLanguageGenerateBenchmark(new_tokens=6, warmup=0, runs=1, image=str(tmp_path / "red.png"))
    red.measure(tiny_llava)
    assert not torch.equal(red.last_tokens, random_picture.last_tokens)


def test_floor_counts_the_language_model_not_the_vision_tower(tiny_llava):
    model = tiny_llava.model
    bench = VisionLanguageGenerateBenchmark()
    tower = part_bytes(model.model.vision_tower) + part_bytes(model.model.multi_modal_projector)
    assert tower > 0
    assert bench.read_bytes(model, None) == weight_bytes_per_token(model) - tower
    # what is left: the language blocks, final norm and LM head (the untied input table is not read)
    language = model.model.language_model
    expected = part_bytes(language) - part_bytes(language.embed_tokens) + part_bytes(model.lm_head)
    assert bench.read_bytes(model, None) == expected


def test_job_logs_vlm_latency_and_speedup(store):
    common = ["model=tiny-llava", "task=easy_vqa", "limit=1", "bench=vlm_generate", "bench.new_tokens=4",
              "bench.warmup=0", "bench.runs=1"]
    dense = run(compose_cfg([*common, "pruner=none"]))
    pruned = run(compose_cfg([*common, "pruner=heads_l2", "sparsity=0.5"]))
    assert dense["latency/speedup"] == 1.0
    assert pruned["latency/speedup"] > 0 and pruned["latency/floor_ratio"] > 0


def test_vlm_generate_is_checked_before_loading():
    with pytest.raises(ConfigError, match="bench='vlm_generate' cannot time model='tiny-llama'"):
        validate(compose_cfg(["model=tiny-llama", "bench=vlm_generate"]))
    with pytest.raises(ConfigError, match="batch 1"):
        validate(compose_cfg(["model=tiny-llava", "task=easy_vqa", "bench=vlm_generate", "bench.batch_size=2"]))
