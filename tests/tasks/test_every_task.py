"""Every `conf/task` option composes with a model of a family it evaluates, builds its tasks (a
dataset only the hub has is deferred, as a plan defers it), and each task built gives its first
documents from the presets' stand-in data (tests/conftest.py `preset_data`), as timm's tests build
every registered model."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FIXTURES, compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.api.requests import CLASSIFY
from prunebench.hub import deferring
from prunebench.paths import CONF_DIR
from prunebench.tasks.build import build_tasks, built

# the model a task's requests need: text tasks a causal LM, GLUE a classifier, pictures ViT or LLaVA
MODELS = {"vision": "tiny-vit", "glue": "tiny-bert-cls", "vlm": "tiny-llava"}
VISION = ("imagenet1k", "cifar100", "food101", "fashion_mnist", "hf_images")
GLUE = ("sst2", "cola", "mrpc", "qqp", "stsb", "qnli", "mnli", "rte", "glue")
VLM = ("scienceqa_img", "vizwiz_vqa", "easy_vqa", "llava_bench_coco", "llava_bench_wild", "mm_vet", "llava_suite",
       "hies_vlm")
JUDGED = {"mm_vet", "llava_bench_coco", "llava_bench_wild"}


BBH_TWO = "subtasks=[boolean_expressions,date_understanding]"  # the two subtasks the fixtures hold
ARC_DEV = "task.protocols.opencompass.arc_easy.source.path={fixtures}/benchmarks/arc/ARC-Easy-Test.jsonl"
# what an option reads beyond the presets' data folder: {vlm} the vision-language fixtures' data_dir,
# {images} their pictures, {judge} a judge server, {vision} the image sets, {fixtures} tests/fixtures
EXTRA = {
    "bbh_zeroshot": [f"task.tasks.bbh_zeroshot.{BBH_TWO}"], "bbh_fewshot": [f"task.tasks.bbh_fewshot.{BBH_TWO}"],
    "bbh_cot_fewshot": [f"task.tasks.bbh_cot_fewshot.{BBH_TWO}"],
    "dynmoe_opencompass": [f"task.tasks.bbh_cot_fewshot.{BBH_TWO}", ARC_DEV],
    "wikitext2_ppl": ["task.tasks.wikitext2_ppl.source.split=train"],
    "local_mc": ["task.tasks.local_mc.source.path={fixtures}/mc_questions.jsonl"],
    "lm_eval": ["task.lm_eval=[arc_easy]"],
    "imagenet1k": ["task.tasks.imagenet1k.source.root={vision[imagenet1k][0]}"],
    **{name: [f"task.tasks.{name}.source.root={{vision[{name}][0]}}"] for name in ("cifar100", "food101", "fashion_mnist")},
}
JUDGE = ["judge=openai_compatible", "judge.url={judge}", "judge.model=test-judge", "judge.api_key_env=null"]
# no data here to build from: what the refusal must name instead
ABSENT = {"bigbench_mc": "bigbench 1.0.0 sdist", "bb_emoji_movie": "bigbench 1.0.0 sdist",
          "bb_general_knowledge": "bigbench 1.0.0 sdist", "bb_similarities_abstraction": "bigbench 1.0.0 sdist",
          "hf_images": "source.path", "lambada_openai": "lambada_test.jsonl"}


def model_for(option: str) -> str:
    if option in VISION:
        return MODELS["vision"]
    if option in GLUE:
        return MODELS["glue"]
    return MODELS["vlm"] if option in VLM else "tiny-llama"


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF_DIR) / "task").glob("*.yaml")))
def test_every_task_option_builds_its_first_documents(option, preset_data):
    root, _, vision, (vlm_root, images, judge) = preset_data
    fill = {"fixtures": FIXTURES, "vision": vision, "judge": judge}
    overrides = [f"model={model_for(option)}", f"task={option}", f"data_dir={vlm_root if option in VLM else root}",
                 "limit=2", *(o.format(**fill) for o in EXTRA.get(option, []))]
    cfg = compose_cfg(overrides)
    if option in VLM:  # the fixtures' pictures, and a judge for a judged task
        members = [name for name, task in cfg.task.tasks.items() if "image_dir" in task]
        judged = [o.format(**fill) for o in JUDGE] if JUDGED & set(cfg.task.tasks) else []
        cfg = compose_cfg([*overrides, *(f"task.tasks.{t}.image_dir={images}" for t in members), *judged])
    deferred: list[str] = []
    if option in ABSENT:
        with pytest.raises(ConfigError, match=ABSENT[option].replace(".", r"\.")):
            with deferring(deferred):
                build_tasks(cfg)
        return
    with deferring(deferred):
        tasks = build_tasks(cfg)
    assert tasks, option
    for name, task in built(tasks).items():
        if task.kind == CLASSIFY:
            assert next(iter(task.examples(2)), None) is not None, name
        else:
            assert task.instances(2), name
