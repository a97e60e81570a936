"""vizwiz_vqa: lmms-eval's prompt over LLaVA's real question file, every image checked before any
model loads, and a run on tiny-llava through the job."""

from __future__ import annotations

import json
import mlflow
import pytest

from conftest import SHARED_DATA, compose_cfg, stand_in_images
from prunebench import job
from prunebench.api.errors import ConfigError
from prunebench.tasks.build import build_tasks
from prunebench.tasks.vqa import normalize_answer

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "pruner=none"]
VIZWIZ = SHARED_DATA / "vizwiz" / "llava_test.jsonl"
POST = ("\nWhen the provided information is insufficient, respond with 'Unanswerable'."
        "\nAnswer the question using a single word or phrase.")


@pytest.mark.shared_data
@pytest.mark.skipif(not VIZWIZ.exists(), reason="needs ../shared/data/vizwiz")
def test_the_real_test_file_parses_with_lmms_eval_prompts(tmp_path):
    names = [json.loads(line)["image"] for line in VIZWIZ.read_text().splitlines()]
    stand_in_images(tmp_path / "images", names)
    cfg = compose_cfg(["model=tiny-llava", "task=vizwiz_vqa", f"data_dir={SHARED_DATA}",
                       f"task.tasks.vizwiz_vqa.image_dir={tmp_path / 'images'}"])
    task = build_tasks(cfg)["vizwiz_vqa"]
    requests = task.instances()
    assert len(requests) == 8000
    # lmms-eval's vizwiz_vqa_doc_to_text: question.capitalize() + post_prompt
    assert [r.prompt for r in requests[:3]] == [
        "What is this? and what color is it?" + POST,
        "What is this?" + POST,
        "Has this oven gotten up to four hundred fifty degrees fahrenheit yet?" + POST]
    assert requests[0].requests[0].images == (tmp_path / "images" / "VizWiz_test_00000000.jpg",)


def write_val(tmp_path) -> list[dict]:
    docs = [{"question_id": 0, "image": "a.jpg", "question": "what colour IS this?",
             "answers": [{"answer": "Red", "answer_confidence": "yes"}] * 10},
            {"question_id": 1, "image": "b.jpg", "question": "What is it?", "answers": ["unanswerable"] * 10}]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    stand_in_images(tmp_path / "images", ["a.jpg", "b.jpg"])
    return docs


def test_missing_images_fail_validation_naming_them(tmp_path):
    write_val(tmp_path)
    (tmp_path / "images" / "b.jpg").unlink()
    cfg = compose_cfg(["model=tiny-llava", "task=vizwiz_vqa", f"task.tasks.vizwiz_vqa.source.path={tmp_path / 'val.jsonl'}",
                       f"task.tasks.vizwiz_vqa.image_dir={tmp_path / 'images'}"])
    with pytest.raises(ConfigError, match=r"task vizwiz_vqa: 1 image\(s\) missing .*b\.jpg"):
        build_tasks(cfg)


def test_vizwiz_val_runs_on_tiny_llava(tmp_path, store):
    write_val(tmp_path)
    cfg = compose_cfg(["model=tiny-llava", "task=vizwiz_vqa", *QUIET,
                       f"task.tasks.vizwiz_vqa.source.path={tmp_path / 'val.jsonl'}",
                       f"task.tasks.vizwiz_vqa.image_dir={tmp_path / 'images'}"])
    metrics = job.run(cfg)
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    assert run.info.status == "FINISHED"
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/vizwiz_vqa.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert records[0]["prompt"] == "What colour is this?" + POST
    for record in records:
        assert record["exact_match_answer"] == normalize_answer(record["response"])
        # every annotator agrees: the soft accuracy is all or nothing
        gold = "red" if record["doc_id"] == 0 else "unanswerable"
        assert record["exact_match"] == float(record["exact_match_answer"] == gold)
    assert metrics["vizwiz_vqa/exact_match"] == sum(r["exact_match"] for r in records) / 2
