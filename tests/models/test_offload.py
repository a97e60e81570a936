"""Pruning a model whose blocks accelerate keeps off the device (pruning.onload, a cpu + disk
device_map) gives the in-memory model's weights bit for bit, and its evaluation the same predictions."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from conftest import MC_FIXTURE, compose_cfg
from helpers.unstructured import CONFIG, calib
from prunebench.job import run
from prunebench.models.hf_causal import load_causal_lm
from prunebench.models.introspection import transformer_blocks
from prunebench.models.offload import is_offloaded, onload_map, onloaded
from prunebench.models.tiny import load_tiny
from prunebench.pruners.dsnot import DSnoTPruner
from prunebench.pruners.owl import OWLPruner
from prunebench.pruners.sleb import SLEBPruner
from prunebench.pruners.unstructured import MagnitudePruner, SparseGPTPruner, WandaPruner
from prunebench.validate import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Llama saved as safetensors with its tokenizer: what from_pretrained offloads from."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny = load_tiny(name="tiny", config={**CONFIG, "num_hidden_layers": LAYERS}, seed=3)
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder


def onload_placement(model) -> dict:
    prefix, blocks = transformer_blocks(model)
    return onload_map(model, prefix, len(blocks), "cpu")


def weights(model) -> dict[str, torch.Tensor]:
    """Every tensor of the model, an offloaded block's read on its device."""
    out = {}
    for module_name, module in model.named_modules():
        with onloaded(module, edits=False):
            for name, tensor in module.named_parameters(prefix=module_name, recurse=False):
                out[name] = tensor.detach().clone()
    return out


PRUNERS = {
    "magnitude": lambda: MagnitudePruner(),
    "wanda": lambda: WandaPruner(),
    "wanda_dense_norms": lambda: WandaPruner(sequential=False),
    "sparsegpt": lambda: SparseGPTPruner(),
    "dsnot": lambda: DSnoTPruner(max_cycles=5),
    "owl": lambda: OWLPruner(lamda=0.04),
    "sleb": lambda: SLEBPruner(max_fraction=0.5),
}


@pytest.mark.parametrize("pruner", list(PRUNERS))
@pytest.mark.parametrize("where", ["onload", "cpu_disk"])
def test_offloaded_pruning_gives_the_in_memory_weights_bit_for_bit(checkpoint, tmp_path, pruner, where):
    memory = load_causal_lm(path=str(checkpoint), name="tiny")
    placement = onload_placement(memory.model)
    if where == "cpu_disk":  # accelerate's own placement: the first block stays on the CPU, the rest on disk
        placement["model.layers.0"] = "cpu"
    offloaded = load_causal_lm(path=str(checkpoint), name="tiny", device_map=placement, offload_folder=str(tmp_path))
    assert is_offloaded(offloaded.model)
    stats = {}
    for name, loaded in (("memory", memory), ("offloaded", offloaded)):
        scorer = PRUNERS[pruner]()
        stats[name] = {key: value for key, value in scorer.apply(loaded, scorer.score(loaded, calib()), 0.5).items()
                       if not key.endswith("_s")}  # seconds differ run to run
    assert stats["offloaded"] == stats["memory"]
    want, got = weights(memory.model), weights(offloaded.model)
    assert want.keys() == got.keys()
    assert [name for name in want if not torch.equal(want[name], got[name])] == []
    assert sum(int((w == 0).sum()) for w in got.values()) > 0 or pruner == "sleb"
    probe = torch.arange(1, 17)[None]
    with torch.no_grad():
        assert torch.equal(memory.model(probe).logits, offloaded.model(probe).logits)


def job(checkpoint, *overrides):
    return compose_cfg(["model=hf_causal", f"model.path={checkpoint}", "model.name=tiny", "task=local_mc",
                        f"task.tasks.local_mc.source.path={MC_FIXTURE}", "trainer.enable_progress_bar=false",
                        "tracking.ensure_dense=false", *overrides])


def predictions(store, run_id):
    path = MlflowClient(store).download_artifacts(run_id, "predictions/local_mc.jsonl")
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize("pruner", ["magnitude", "wanda", "sparsegpt", "sleb"])
def test_jobs_on_an_onloaded_and_a_cpu_disk_placed_model_predict_as_the_in_memory_one(store, checkpoint, calib_text,
                                                                                      pruner):
    from accelerate import infer_auto_device_map

    from prunebench.models.offload import meta_model
    from prunebench.models.pretrained import checkpoint_config

    common = [f"pruner={pruner}", "sparsity=0.5", "tracking.skip_existing=false"]
    if pruner != "magnitude":
        common += calib_text(4)
    shapes = meta_model(checkpoint_config(str(checkpoint)))
    block = sum(p.numel() * 4 for p in transformer_blocks(shapes)[1][0].parameters())
    # host memory for the embeddings, the head and one block: the later blocks go to disk
    placed = infer_auto_device_map(shapes, max_memory={"cpu": int(3.5 * block)},
                                   no_split_module_classes=["LlamaDecoderLayer"])
    assert "disk" in placed.values() and "cpu" in placed.values()
    memory = run(job(checkpoint, *common))
    onloaded_cfg = job(checkpoint, *common, "pruning.onload=sequential")
    onloaded_metrics = run(onloaded_cfg)
    placed_cfg = job(checkpoint, *common)
    with open_dict(placed_cfg):
        placed_cfg.model.device_map = dict(placed)
    placed_metrics = run(placed_cfg)
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert [r.data.tags.get("prunebench.onload") for r in runs] == [None, "sequential", None]
    for other in (onloaded_metrics, placed_metrics):
        for name in ("local_mc/acc", "local_mc/acc_norm", "sparsity/actual", "params/nonzero"):
            assert other[name] == memory[name], name
    first = predictions(store, runs[0].info.run_id)
    assert predictions(store, runs[1].info.run_id) == first
    assert predictions(store, runs[2].info.run_id) == first
    assert runs[1].data.metrics["memory/peak_host_gb"] > 0


def test_a_job_that_does_not_fit_one_block_at_a_time_is_refused_naming_the_numbers(checkpoint, calib_text):
    cfg = job(checkpoint, "pruner=sparsegpt", *calib_text(4), "pruning.onload=sequential", "pruning.memory_gb=0.0001")
    with pytest.raises(ConfigError) as err:
        run(cfg)
    message = str(err.value)
    # one block of the tiny Llama: 4 x 64 x 64 (q, o) + 2 x 32 x 64 (k, v) + 3 x 64 x 128 (MLP) + 2 x 64, fp32
    block = (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64) * 4
    assert f"one block {block / 1e9:.3g} GB" in message and "budget is 0.0001 GB" in message
    assert "calibration activations" in message and "pruning.memory_gb" in message


@pytest.mark.parametrize("overrides, words", [
    (["pruning.onload=always"], "pruning.onload='always': use one of ['none', 'sequential', 'auto']"),
    (["pruner=flap", "pruning.onload=sequential"], "pruner='flap' cannot prune onloaded"),
    (["pruner=magnitude", "pruner.scope=global", "pruning.onload=sequential"], "scope=global"),
])
def test_onload_options_are_refused_before_loading(checkpoint, overrides, words):
    with pytest.raises(ConfigError) as err:
        run(job(checkpoint, *overrides))
    assert words in str(err.value)


def test_a_model_built_in_memory_cannot_onload():
    cfg = compose_cfg(["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
                       "pruning.onload=sequential"])
    with pytest.raises(ConfigError) as err:
        run(cfg)
    assert "save it (save_pretrained) and use model=hf_causal model.path=FOLDER" in str(err.value)


def test_a_plan_says_which_jobs_onload_and_the_memory_each_needs(checkpoint, calib_text, store):
    from prunebench.plan import plan

    base = ["model=hf_causal", f"model.path={checkpoint}", "model.name=tiny", "task=local_mc",
            f"task.tasks.local_mc.source.path={MC_FIXTURE}", "pruner=sparsegpt", "sparsity=0.5", *calib_text(4),
            "tracking.ensure_dense=false"]
    # the tiny model onloaded: 1.21 MB (head and embeddings, two blocks, SparseGPT's Hessians); whole: 1.51 MB
    jobs = plan([[*base, "pruning.onload=auto", "pruning.memory_gb=0.0013"],
                 [*base, "pruning.onload=auto", "pruning.memory_gb=1", "seed=1"],
                 [*base, "pruning.onload=auto", "pruning.memory_gb=0.001", "seed=2"],
                 [*base, "pruning.onload=none"]], compose_cfg)
    assert [job.status for job in jobs] == ["left", "left", "invalid", "repeat"]
    assert "/onload " in jobs[0].cost and "/whole " in jobs[1].cost, [job.cost for job in jobs]
    onloaded, whole = (float(job.cost.split(where)[1].removesuffix("GB"))
                       for job, where in zip(jobs, ("/onload ", "/whole ")))
    assert onloaded < 0.0013 < whole
    assert "needs 0.00121 GB on cpu even onloaded" in jobs[2].note and "budget is 0.001 GB" in jobs[2].note
    assert jobs[3].note == "same run key as #0"  # onloading or not, one job: pruning.* is a runtime field
