"""Image classification on a tiny random timm ViT, each source read from files written here in its
real on-disk layout (nothing is downloaded); top-1/top-5 checked against a direct computation."""

from __future__ import annotations

import json
import pickle

import mlflow
import numpy as np
import pytest
import torch
from PIL import Image

from conftest import compose_cfg, identity_model
from helpers.images import cifar100, fashion_mnist, food101, image_folder, pixels
from prunebench import job
from prunebench.evaluation.classification.engine import ClassificationModule
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.validate import validate

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "tracking.ensure_dense=false"]
def hf_parquet(path, n: int = 6):
    import datasets

    rows = datasets.Dataset.from_dict({"image": [Image.fromarray(a) for a in pixels(n)], "label": [i % 3 for i in range(n)]},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "label": datasets.ClassLabel(names=["a", "b", "c"])}))
    rows.to_parquet(str(path))
    return path


@pytest.mark.parametrize("task,make,override,n,classes", [
    ("imagenet1k", image_folder, "root", 20, 10),
    ("cifar100", cifar100, "root", 12, 100),
    ("fashion_mnist", fashion_mnist, "root", 12, 10),
    ("food101", food101, "root", 6, 2),
])
def test_sources_read_their_layouts(tmp_path, task, make, override, n, classes):
    make(tmp_path)
    tasks = validate(compose_cfg(["model=tiny-vit", f"task={task}", f"task.tasks.{task}.source.root={tmp_path}",
                                  "sparsity=0", "pruner=none"]))
    examples = tasks[task].examples()
    assert len(examples) == n and tasks[task].num_labels == classes
    image, label = examples[0]
    assert isinstance(image, Image.Image) and 0 <= label < classes


def test_hf_image_dataset(tmp_path):
    path = hf_parquet(tmp_path / "test.parquet")
    tasks = validate(compose_cfg(["model=tiny-vit", "task=hf_images", "task.tasks.hf_images.source.path=parquet",
                                  "task.tasks.hf_images.source.split=train",
                                  f"task.tasks.hf_images.source.data_files={path}", "sparsity=0", "pruner=none"]))
    assert tasks["hf_images"].num_labels == 3 and len(tasks["hf_images"].examples()) == 6


def test_missing_root_fails_before_the_model_loads(tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        validate(compose_cfg(["model=tiny-vit", "task=cifar100", f"task.tasks.cifar100.source.root={tmp_path}",
                              "sparsity=0", "pruner=none"]))


def test_class_count_is_checked(tmp_path):
    cifar100(tmp_path)
    tasks = validate(compose_cfg(["model=tiny-vit", "task=cifar100", f"task.tasks.cifar100.source.root={tmp_path}",
                                  "sparsity=0", "pruner=none"]))
    with pytest.raises(ValueError, match="has 100 classes but model 'tiny-vit' outputs 10"):
        evaluation(tasks["cifar100"], get_model(compose_cfg(["model=tiny-vit"]).model), None, None)


def test_top_k_match_direct_computation():
    torch.manual_seed(0)
    module = ClassificationModule(identity_model(), "t", ["top1", "top5"], 10)
    logits, gold = torch.randn(40, 10), torch.randint(0, 10, (40,))
    module.test_step({"pixel_values": logits, "labels": gold}, 0)
    ranked = logits.argsort(-1, descending=True)
    assert module.metrics["top1"].compute().item() == pytest.approx((ranked[:, 0] == gold).float().mean().item())
    top5 = (ranked[:, :5] == gold[:, None]).any(-1).float()
    assert module.metrics["top5"].compute().item() == pytest.approx(top5.mean().item())
    assert module.stderr("top5") == pytest.approx(top5.std().item() / 40 ** 0.5)


def test_pruned_vit_job_with_bench(tmp_path, store):
    root = image_folder(tmp_path / "val")
    metrics = job.run(compose_cfg(["model=tiny-vit", "task=imagenet1k", f"task.tasks.imagenet1k.source.root={root}",
                                   "pruner=heads_l2", "sparsity=0.5", "bench=vision", "bench.throughput_batch=4",
                                   "bench.warmup=1", "bench.runs=2", *QUIET]))
    assert metrics["sparsity/actual"] == 0.5 and metrics["sparsity/flops"] > 0
    assert metrics["latency/median_s"] > 0 and metrics["throughput/images_per_s"] > 0
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/imagenet1k.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert len(records) == 20
    assert metrics["imagenet1k/top1"] == pytest.approx(np.mean([r["gold"] == r["pred"] for r in records]))
    assert metrics["imagenet1k/top1"] <= metrics["imagenet1k/top5"]


def test_hies_on_vit_calibrates_on_a_labelled_train_folder(tmp_path, store):
    val, train = image_folder(tmp_path / "val", 1), image_folder(tmp_path / "train", 1)
    metrics = job.run(compose_cfg(["model=tiny-vit", "task=imagenet1k", f"task.tasks.imagenet1k.source.root={val}",
                                   "pruner=hies", "calib=labelled", "task@calib.task=imagenet1k",
                                   f"calib.task.tasks.imagenet1k.source.root={train}", "calib.n_samples=4", "sparsity=0.25", *QUIET]))
    assert metrics["sparsity/actual"] == 0.25 and 0 <= metrics["imagenet1k/top1"] <= 1


def test_a_crafted_cifar_file_cannot_run_code(tmp_path):
    import os

    from prunebench.tasks.vision import Cifar100Test

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    folder = cifar100(tmp_path) / "cifar-100-python"
    assert len(Cifar100Test(folder)) == 12  # the real format still loads
    with open(folder / "test", "wb") as f:
        pickle.dump({"data": Exploit()}, f)
    with pytest.raises(pickle.UnpicklingError, match="refuses posix.system|refuses os.system"):
        Cifar100Test(folder)
    assert not (tmp_path / "pwned").exists()
