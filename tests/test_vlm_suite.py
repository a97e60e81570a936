"""The acceptance sweep of the vision-language path, smaller: tiny-llava, pruner none / magnitude /
heads_his at 0.3, task=llava_suite (the five tasks) on fixture files, graded by a chat-completions server
on 127.0.0.1; the rerun judges nothing. Also VizWiz's test split as a submission."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow

from helpers.chat_server import ChatServer, benchmark_judge
from helpers.vlm_fixtures import SUITE_TASKS, suite_overrides, write_vlm_data

JUDGED = ("llava_bench_coco", "llava_bench_wild", "mm_vet")
PRUNERS = ("none", "magnitude", "heads_his")


def sweep(url: str, data, images, *extra: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", "model=tiny-llava", f"pruner={','.join(PRUNERS)}",
                           "sparsity=0.3", "limit=4", "calib=image_text", "calib.n_samples=2", "judge=openai_compatible",
                           f"judge.url={url}",
                           "judge.model=test-judge", "judge.api_key_env=null",
                           "trainer.enable_progress_bar=false", *suite_overrides(data, images), *extra],
                          capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_suite_sweep_finishes_and_a_rerun_judges_nothing(tmp_path, store, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    data, images = write_vlm_data(tmp_path / "data")
    with ChatServer(benchmark_judge) as server:
        sweep(server.url, data, images)
        first = len(server.requests)
        # again, into a fresh experiment so no job is skipped: every answer is regenerated and looked up
        sweep(server.url, data, images, "tracking.experiment=rerun")
        assert len(server.requests) == first
    mlflow.set_tracking_uri(store)
    for experiment, hits in (("prunebench", 0), ("rerun", 4)):
        runs = mlflow.search_runs(experiment_names=[experiment], output_format="list")
        jobs = [r for r in runs if "prunebench.run_key" in r.data.tags]
        assert sorted(r.data.tags["prunebench.pruner"] for r in jobs) == sorted(PRUNERS)
        for run in jobs:
            m = run.data.metrics
            assert run.info.status == "FINISHED"
            for name in JUDGED:
                assert m[f"{name}/judge_cache_hits"] == hits and m[f"{name}/judge_unparsed"] == 0
            assert {"scienceqa_img/exact_match", "llava_bench_coco/gpt_eval_llava_all", "llava_bench_wild/gpt_eval_llava_conv",
                    "mm_vet/gpt_eval_score", "avg/score"} <= set(m)
            # the test split: no answers, no metric
            assert not any(k.startswith("vizwiz_vqa/") and k not in ("vizwiz_vqa/n_docs", "vizwiz_vqa/n_truncated") for k in m)
            if run.data.tags["prunebench.pruner"] != "none":
                assert "stability/avg" in m and "stability/vizwiz_vqa" not in m
            artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "predictions")}
            assert artifacts == {f"predictions/{t}.jsonl" for t in SUITE_TASKS}
        # the judge scores 8 vs 6 and 0.5 everywhere, whatever the model said
        assert {r.data.metrics["llava_bench_coco/gpt_eval_llava_all"] for r in jobs} == {75.0}
        assert {r.data.metrics["mm_vet/gpt_eval_score"] for r in jobs} == {50.0}


def test_vizwiz_test_split_writes_the_submission_file(tmp_path, store):
    from conftest import compose_cfg
    from prunebench import job

    data, images = write_vlm_data(tmp_path / "data")
    metrics = job.run(compose_cfg(["model=tiny-llava", "task=vizwiz_vqa", "pruner=none", "limit=3", f"data_dir={data}",
                                   f"task.tasks.vizwiz_vqa.image_dir={images}", "trainer.enable_progress_bar=false"]))
    assert "avg/score" not in metrics
    assert not any(k.startswith("vizwiz_vqa/") and k not in ("vizwiz_vqa/n_docs", "vizwiz_vqa/n_truncated") for k in metrics)
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="submission/vizwiz_vqa.json")
    submission = json.load(open(path))
    predictions = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/vizwiz_vqa.jsonl")
    records = [json.loads(line) for line in open(predictions)]
    # EvalAI's format, as LLaVA's convert_vizwiz_for_submission.py writes it: the image and the normalised answer
    assert submission == [{"image": r["image"], "answer": r["exact_match_answer"]} for r in records]
    assert sorted(s["image"] for s in submission) == [f"VizWiz_test_{i:08d}.jpg" for i in range(3)]
