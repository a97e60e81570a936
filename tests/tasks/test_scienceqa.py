"""scienceqa_img: LLaVA's real prompt file read as it is (the image subset), lmms-eval's prompts,
both scorings, and a run on tiny-llava."""

from __future__ import annotations

import json

import mlflow
import pytest

from conftest import SHARED_DATA, compose_cfg, stand_in_images
from prunebench import job
from prunebench.tasks.build import build_tasks

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "pruner=none"]
SQA = SHARED_DATA / "scienceqa" / "llava_test_CQM-A.json"
POST = "\nAnswer with the option's letter from the given choices directly."


def sqa_cfg(data: list[str], images) -> list[str]:
    return ["model=tiny-llava", "task=scienceqa_img", *data, f"task.tasks.scienceqa_img.image_dir={images}"]


@pytest.mark.shared_data
@pytest.mark.skipif(not SQA.exists(), reason="needs ../shared/data/scienceqa")
def test_the_real_file_parses_to_the_image_subset_with_lmms_eval_prompts(tmp_path):
    items = json.loads(SQA.read_text())
    names = sorted({item["image"] for item in items if "image" in item})
    stand_in_images(tmp_path / "images", names)
    task = build_tasks(compose_cfg(sqa_cfg([f"data_dir={SHARED_DATA}"], tmp_path / "images")))["scienceqa_img"]
    requests = task.instances()
    assert len(requests) == 2017  # ScienceQA-IMG test
    # lmms-eval's sqa_doc_to_text: "Context: {hint}\n" when a hint exists, question, "A. ..." lines, post-prompt
    first = ("Context: People can use the engineering-design process to develop solutions to problems. One step in the "
             "process is testing if a potential solution meets the requirements of the design.\nThe passage below "
             "describes how the engineering-design process was used to test a solution to a problem. Read the passage. "
             "Then answer the question below.\n\nGordon was an aerospace engineer who was developing a parachute for a "
             "spacecraft that would land on Mars. He needed to add a vent at the center of the parachute so the spacecraft "
             "would land smoothly. However, the spacecraft would have to travel at a high speed before landing. If the vent "
             "was too big or too small, the parachute might swing wildly at this speed. The movement could damage the "
             "spacecraft.\nSo, to help decide how big the vent should be, Gordon put a parachute with a 1 m vent in a wind "
             "tunnel. The wind tunnel made it seem like the parachute was moving at 200 km per hour. He observed the "
             "parachute to see how much it swung.\nFigure: a spacecraft's parachute in a wind tunnel.\nWhich of the "
             "following could Gordon's test show?\nA. if the spacecraft was damaged when using a parachute with a 1 m vent "
             "going 200 km per hour\nB. how steady a parachute with a 1 m vent was at 200 km per hour\nC. whether a "
             "parachute with a 1 m vent would swing too much at 400 km per hour" + POST)
    second = "What is the name of the colony shown?\nA. Maryland\nB. New Hampshire\nC. Rhode Island\nD. Vermont" + POST
    third = ("Context: Below is a food web from a tundra ecosystem in Nunavut, a territory in Northern Canada.\nA food web "
             "models how the matter eaten by organisms moves through an ecosystem. The arrows in a food web represent how "
             "matter moves between organisms in an ecosystem.\nWhich of these organisms contains matter that was once part "
             "of the lichen?\nA. bilberry\nB. mushroom" + POST)
    assert [r.prompt for r in requests[:3]] == [first, second, third]
    assert [r.target for r in requests[:3]] == ["B", "B", "B"]
    assert [r.doc["n_choices"] for r in requests[:3]] == [3, 4, 2]


def test_scienceqa_img_runs_on_tiny_llava(tmp_path, store):
    items = [{"id": "1", "conversations": [{"from": "human", "value": "Which is it?\nA. one\nB. two"},
                                            {"from": "gpt", "value": "A"}]},
             {"id": "2", "image": "2/image.png", "conversations": [
                 {"from": "human", "value": "<image>\nContext: A map.\nWhich colony?\nA. Maryland\nB. Vermont\nC. Ohio"},
                 {"from": "gpt", "value": "C"}]}]
    (tmp_path / "q.json").write_text(json.dumps(items))
    stand_in_images(tmp_path / "images", ["2/image.png"])
    cfg = compose_cfg([*sqa_cfg([f"task.tasks.scienceqa_img.source.path={tmp_path / 'q.json'}"], tmp_path / "images"),
                       *QUIET])
    metrics = job.run(cfg)
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/scienceqa_img.jsonl")
    (record,) = [json.loads(line) for line in open(path)]  # the text-only question is not in the IMG subset
    assert record["prompt"] == "Context: A map.\nWhich colony?\nA. Maryland\nB. Vermont\nC. Ohio" + POST
    assert metrics["scienceqa_img/exact_match"] == record["exact_match"]
    assert metrics["scienceqa_img/llava_acc"] == float(record["llava_acc_answer"] == "C")
