"""easy_vqa: the one real VQA set installable here, run on tiny-llava through the job."""

from __future__ import annotations

import json

import mlflow
import pytest

from conftest import compose_cfg
from prunebench import job
from prunebench.tasks.build import build_tasks

pytest.importorskip("easy_vqa")
QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "pruner=none"]


def test_easy_vqa_reads_the_package_with_its_images():
    task = build_tasks(compose_cfg(["model=tiny-llava", "task=easy_vqa"]))["easy_vqa"]
    requests = task.instances()
    assert len(requests) == 9673
    first = requests[0]
    assert first.prompt == "what is the red shape?\nAnswer the question using a single word or phrase."
    assert first.target == "triangle" and first.requests[0].images[0].is_file()


def test_easy_vqa_runs_on_tiny_llava(store):
    metrics = job.run(compose_cfg(["model=tiny-llava", "task=easy_vqa", "limit=4", *QUIET]))
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    assert run.info.status == "FINISHED"
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/easy_vqa.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert len(records) == 4
    for r in records:  # exact match ignoring case, spaces around and a final period
        assert r["exact_match"] == float(r["response"].strip().rstrip(".").strip().lower() == r["target"])
    assert metrics["easy_vqa/exact_match"] == sum(r["exact_match"] for r in records) / 4
