"""Where models live and what a job's memory peaks at: the pristine model stays in host memory, a
device-mapped model goes through accelerate from the loader, and every job logs `memory/peak_*`."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest
import torch

from conftest import TINY_MC, compose_cfg
from prunebench.evaluation.batching import budget
from prunebench.evaluation.registry import evaluation
from prunebench.job import run
from prunebench.models import cache
from prunebench.validate import ConfigError, validate


def test_the_job_copy_goes_to_model_device_while_the_pristine_model_stays_on_the_host():
    cfg = compose_cfg(["model=tiny-llama", "model.device=meta"])  # a device without memory stands in for a GPU
    first, second = cache.get_model(cfg.model), cache.get_model(cfg.model)
    assert first.device.type == second.device.type == "meta"
    (pristine,) = cache._PRISTINE.values()
    assert pristine.device.type == "cpu"


def test_each_job_gets_its_own_weights_and_shares_the_tokenizer():
    cfg = compose_cfg(["model=tiny-llama"])
    first, second = cache.get_model(cfg.model), cache.get_model(cfg.model)
    with torch.no_grad():
        next(first.model.parameters()).zero_()  # a job pruning its copy
    assert next(second.model.parameters()).abs().sum() > 0
    assert first.tokenizer is second.tokenizer is next(iter(cache._PRISTINE.values())).tokenizer


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """tiny-llama saved as a Hugging Face checkpoint, so the from_pretrained loader reads it."""
    loaded = cache.get_model(compose_cfg(["model=tiny-llama"]).model)
    path = tmp_path_factory.mktemp("tiny-llama")
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return path


def test_device_map_reaches_from_pretrained_and_skips_the_in_process_cache(tiny_checkpoint, monkeypatch):
    from transformers import AutoModelForCausalLM

    real, seen = AutoModelForCausalLM.from_pretrained, []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return real(*args, **kwargs)

    # a one-device map sets no hf_device_map, so on a CPU only the call itself shows the placement
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    cfg = compose_cfg(["model=hf_causal", f"model.path={tiny_checkpoint}", "model.device_map=auto"])
    cache._PRISTINE.clear()
    loaded = cache.get_model(cfg.model)
    assert seen == ["auto"] and loaded.device.type == "cpu"
    assert not cache._PRISTINE


def test_a_model_read_from_files_is_held_once_and_each_job_reads_it_again_unpruned(tiny_checkpoint):
    cfg = compose_cfg(["model=hf_causal", f"model.path={tiny_checkpoint}"])
    cache._PRISTINE.clear()
    first = cache.get_model(cfg.model)
    (kept,) = cache._PRISTINE.values()
    assert kept.model is None and kept.tokenizer is first.tokenizer  # no weights waiting beside the job's
    with torch.no_grad():
        for weight in first.model.parameters():
            weight.zero_()  # the first job prunes the very model that was loaded
    second = cache.get_model(cfg.model)
    assert second.model is not first.model and second.tokenizer is first.tokenizer
    assert all(weight.abs().sum() > 0 for weight in second.model.parameters())


def test_the_last_jobs_model_is_freed_before_the_next_one_loads(tiny_checkpoint):
    cfg = compose_cfg(["model=hf_causal", f"model.path={tiny_checkpoint}"])
    first = cache.get_model(cfg.model)
    gone = weakref.ref(first.model)
    cycle = [first]
    cycle.append(cycle)  # as Lightning's trainer, module and model refer to one another
    del first, cycle
    gc.disable()  # the collector would otherwise run on its own at some allocation while loading
    try:
        cache.get_model(cfg.model)
    finally:
        gc.enable()
    assert gone() is None


def test_a_sweep_gives_its_dense_job_the_unpruned_model_after_a_pruned_one(tiny_checkpoint, store):
    from transformers import AutoModelForCausalLM

    from prunebench.models.introspection import count_parameters

    # ensure_dense off: the baseline would otherwise run first
    job = TINY_MC[1:] + ["model=hf_causal", f"model.path={tiny_checkpoint}", "tracking.ensure_dense=false"]
    pruned = run(compose_cfg(job + ["pruner=magnitude", "sparsity=0.5"]))
    dense = run(compose_cfg(job + ["pruner=none"]))
    unpruned = count_parameters(AutoModelForCausalLM.from_pretrained(tiny_checkpoint), nonzero=True)
    assert pruned["params/nonzero"] < unpruned == dense["params/nonzero"]


@pytest.mark.parametrize("overrides, message", [
    (["model=tiny-llama", "+model.device_map=auto"], "not loaded through Hugging Face's from_pretrained"),
    (["model=hf_causal", "model.path=x", "model.device_map=everywhere"], "use one of ['auto'"),
])
def test_a_device_map_that_cannot_work_fails_validation(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate(compose_cfg(TINY_MC[1:] + overrides))


HOST_PEAK = """
import torch

from prunebench.bench import memory

memory.reset_peaks()
before = memory.peaks()["memory/peak_host_gb"]
block = torch.ones(300_000_000, dtype=torch.int8)  # 0.3 GB, written so it is resident
del block
assert memory.peaks()["memory/peak_host_gb"] >= before + 0.25  # the pages counted may differ a little
memory.reset_peaks()
assert memory.peaks()["memory/peak_host_gb"] < before + 0.25
"""


@pytest.mark.process
def test_host_peak_is_reset_per_job_and_sees_an_allocation():
    # in a process of its own: what earlier tests left in this one's heap must not decide the result
    done = subprocess.run([sys.executable, "-c", HOST_PEAK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_job_logs_its_memory_peaks(store):
    metrics = run(compose_cfg(TINY_MC + ["pruner=none"]))
    assert metrics["memory/peak_host_gb"] > 0
    assert ("memory/peak_accelerator_gb" in metrics) == torch.cuda.is_available()


def test_a_cpu_scores_in_smaller_batches_unless_told_and_generation_keeps_its_budget():
    cfg = compose_cfg(TINY_MC)
    assert cfg.eval.batch_tokens is None  # the default: each engine's own
    (task,) = validate(cfg).values()
    data, _ = evaluation(task, cache.get_model(cfg.model), None, cfg.eval)
    assert data.batch_tokens == 2048 and data.batches
    assert all(len(batch) * data.cost(batch[0]) <= 2048 for batch in data.batches)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    told = compose_cfg(TINY_MC + ["eval.batch_tokens=512"]).eval
    assert [budget(cfg.eval, cpu, True), budget(cfg.eval, gpu, True), budget(cfg.eval, cpu, False)] == [2048, 8192, 8192]
    assert {budget(told, device, scoring) for device in (cpu, gpu) for scoring in (True, False)} == {512}
