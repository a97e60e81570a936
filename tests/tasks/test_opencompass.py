"""OpenCompass's PPL protocol on a tiny model: its per-option value against a direct computation
from the model's full logits, the lowest-wins rule, option filtering, CommonsenseQA's prompts with
in-context examples, the task.protocol switch on real configs, and whole jobs."""

from __future__ import annotations

import json

import lightning as L
import mlflow
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import FIXTURES, close_to, compose_cfg
from prunebench.evaluation.loglikelihood.engine import LoglikelihoodDataModule
from prunebench.evaluation.registry import evaluation
from prunebench.job import run
from prunebench.models.tiny import load_tiny
from prunebench.tasks.ai2_format import read_question
from prunebench.tasks.build import task_definitions
from prunebench.tasks.multiple_choice import MultipleChoiceTask
from prunebench.tasks.opencompass import PPLChoiceTask
from prunebench.tasks.sources import JsonSource
from prunebench.validate import ConfigError, validate

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
PIQA = dict(prompt="The following makes sense: \nQ: {{goal}}\nA: {{option}}\n", doc_to_choice="{{[sol1, sol2]}}",
            doc_to_target="label")
TINY = ["model=tiny-llama", "trainer.enable_progress_bar=false"]
RELEASE = FIXTURES / "benchmarks"  # the data_dir layout, each benchmark in its release format
CSQA_TRAIN = RELEASE / "commonsenseqa" / "train_rand_split.jsonl"
CSQA = "task.protocols.opencompass.commonsense_qa"
# ARC-e's OpenCompass version reads the dev split; the test-split fixture stands in for it
ARC_DEV = f"task.protocols.opencompass.arc_easy.source.path={RELEASE / 'arc' / 'ARC-Easy-Test.jsonl'}"


def piqa_task(**kwargs) -> PPLChoiceTask:
    return PPLChoiceTask("piqa", JsonSource(str(FIXTURES / "piqa_mini.jsonl")), **{**PIQA, **kwargs})


def opencompass_value(model, ids: list[int]) -> float:
    """OpenCompass's get_ppl for one unpadded row: CE of tokens 1.. summed, over all tokens."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item() / len(ids)


def score(tiny, task, batch_tokens: int) -> tuple[float, LoglikelihoodDataModule, list[dict]]:
    data, module = evaluation(task, tiny, None, OmegaConf.create({"batch_tokens": batch_tokens, "add_bos": None}))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    return trainer.test(module, datamodule=data, verbose=False)[0][f"{task.name}/acc"], data, module.records


def assert_records_are_get_ppl(tiny, task, records: list[dict]) -> None:
    """Each option's value is its whole text's mean cross-entropy, computed directly; lowest wins."""
    instances = task.instances()
    assert len(records) == len(instances)
    for record in records:
        inst = instances[record["doc_id"]]
        ids = [tiny.tokenizer.encode(t) for t in inst.texts]
        assert all(x[0] == tiny.tokenizer.bos_token_id and len(x) <= tiny.max_length for x in ids)
        expected = [opencompass_value(tiny.model, x) for x in ids]
        assert record["texts"] == inst.texts
        assert record["mean_ce"] == close_to(expected, depth=2)  # batched and padded vs alone: reordered sums
        assert record["pred"] == expected.index(min(expected))


def test_option_values_equal_opencompass_get_ppl_and_the_lowest_wins():
    tiny = load_tiny(name="tiny", config=CONFIG)
    task = piqa_task()
    acc, data, records = score(tiny, task, batch_tokens=64)
    assert len(data.batches) > 1                                     # the budget splits the documents
    assert acc == pytest.approx(sum(r["acc"] for r in records) / 3)
    assert_records_are_get_ppl(tiny, task, records)


def test_prompt_renders_the_option_and_n_choices_drops_other_items():
    inst = piqa_task().instances(1)[0]
    assert inst.texts[1] == ("The following makes sense: \nQ: How do I keep bread fresh?\n"
                             "A: Store it in a bucket of water.\n")
    assert inst.gold == 0
    assert piqa_task(n_choices=3).docs() == []


def test_opencompass_task_in_a_job(store):
    overrides = ["model=tiny-llama", "pruner=none", "trainer.enable_progress_bar=false", "task=dynmoe_opencompass",
                 "~task.tasks.hellaswag", "~task.tasks.arc_easy", "~task.tasks.commonsense_qa",
                 "~task.tasks.bbh_cot_fewshot", f"task.tasks.piqa.source.path={FIXTURES / 'piqa_mini.jsonl'}"]
    metrics = run(compose_cfg(overrides))
    assert 0.0 <= metrics["piqa/acc"] <= 1.0 and "piqa/acc_stderr" in metrics
    assert metrics["avg/score"] == metrics["piqa/acc"]
    assert mlflow.search_runs(experiment_names=["prunebench"])["tags.prunebench.protocol"].tolist() == ["opencompass"]


@pytest.mark.parametrize("protocol, metrics", [("lm_eval", {"piqa/acc", "piqa/acc_norm"}),
                                               ("opencompass", {"piqa/acc"})])
def test_task_protocol_switch_in_a_job_and_its_tag(store, protocol, metrics):
    """One source override serves both versions: the OpenCompass one reads the lm-eval task's source."""
    logged = run(compose_cfg(TINY + ["pruner=none", "task=piqa", f"task.protocol={protocol}",
                                     f"task.tasks.piqa.source.path={FIXTURES / 'piqa_mini.jsonl'}"]))
    assert {name for name in logged if name.startswith("piqa/") and not name.endswith(("_stderr", "/n_docs", "/n_truncated"))} == metrics
    assert mlflow.search_runs(experiment_names=["prunebench"])["tags.prunebench.protocol"].tolist() == [protocol]


@pytest.mark.parametrize("suite, names", [("piqa", ["piqa"]), ("hellaswag", ["hellaswag"]), ("arc_easy", ["arc_easy"]),
                                          ("commonsense_qa", ["commonsense_qa"]),
                                          ("dynmoe", ["piqa", "hellaswag", "arc_easy", "commonsense_qa"])])
def test_protocol_switch_selects_each_tasks_opencompass_version(suite, names):
    base = TINY + [f"task={suite}", f"data_dir={RELEASE}"] + ([ARC_DEV] if "arc_easy" in names else [])
    lm_eval = validate(compose_cfg(base))
    opencompass = validate(compose_cfg(base + ["task.protocol=opencompass"]))
    assert list(lm_eval) == list(opencompass) == names
    assert all(isinstance(task, MultipleChoiceTask) for task in lm_eval.values())
    assert all(isinstance(task, PPLChoiceTask) for task in opencompass.values())
    for name in set(names) - {"arc_easy"}:                    # ARC-e's versions read different splits
        assert len(opencompass[name].instances()) == len(lm_eval[name].instances())
    if "arc_easy" in names:                                   # only items with exactly 4 options
        assert 0 < len(opencompass["arc_easy"].docs()) < len(lm_eval["arc_easy"].docs())


def test_dynmoe_opencompass_is_dynmoe_under_the_opencompass_protocol_plus_bbh():
    alias = compose_cfg(TINY + ["task=dynmoe_opencompass"])
    switched = compose_cfg(TINY + ["task=dynmoe", "task.protocol=opencompass"])
    assert alias.task.protocol == "opencompass"
    assert list(alias.task.tasks) == [*switched.task.tasks, "bbh_cot_fewshot"]
    picked = {name: where for name, (where, _) in task_definitions(alias).items()}
    assert picked == {**{name: f"task.protocols.opencompass.{name}" for name in switched.task.tasks},
                      "bbh_cot_fewshot": "task.tasks.bbh_cot_fewshot"}
    assert {n: d for n, (_, d) in task_definitions(switched).items()} == \
        {n: d for n, (_, d) in task_definitions(alias).items() if n != "bbh_cot_fewshot"}


def refuse(*args, **kwargs):
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize("overrides, match", [
    (["task=winogrande", "task.protocol=opencompass"],
     r"task\.protocol='opencompass': task winogrande has no opencompass version; its protocols: \['lm_eval'\]"),
    (["task=commonsense", "task.protocol=opencompass"], "task arc_challenge has no opencompass version"),
    (["task=piqa", "task.protocol=helm"],
     r"task piqa has no helm version; its protocols: \['lm_eval', 'opencompass'\]"),
    (["task=dynmoe", "task.protocol=opencompass"],  # no ARC-Easy-Dev.jsonl under data_dir, no wheel to fall back on
     r"task arc_easy \(task\.protocols\.opencompass\.arc_easy\): .*ARC-Easy-Dev\.jsonl.*does not exist.*"
     r"task\.protocols\.opencompass\.arc_easy\.source\.path=FILE"),
    (["task=hellaswag", "task.protocol=opencompass", "task.tasks.hellaswag.source.path=/nope/hellaswag.jsonl"],
     r"task hellaswag \(task\.protocols\.opencompass\.hellaswag\): .*/nope/hellaswag\.jsonl.*does not exist.*"
     r"task\.tasks\.hellaswag\.source\.path=FILE"),              # its documents are the lm-eval task's
])
def test_a_task_without_that_protocols_version_fails_before_any_model_loads(monkeypatch, overrides, match, no_wheel):
    monkeypatch.setattr("prunebench.pruning.get_model", refuse)
    with pytest.raises(ConfigError, match=match):
        run(compose_cfg(TINY + [f"data_dir={RELEASE}", *overrides]))


def csqa_task(*overrides: str) -> PPLChoiceTask:
    cfg = compose_cfg(TINY + ["task=commonsense_qa", "task.protocol=opencompass", f"data_dir={RELEASE}", *overrides])
    return validate(cfg)["commonsense_qa"]


def test_csqa_zero_shot_prompts_are_opencompass_template_verbatim():
    task = csqa_task()
    assert task.retriever == "none"
    baker, jellyfish = task.instances()[1:]
    # the stem as released (OpenCompass does not strip it), "\nAnswer: ", the option text on its own line
    assert baker.texts == [f"Question:  What does a baker mostly do in the morning? \n\nAnswer: \n{option}"
                           for option in ["bake bread", "sing songs", "fly kites", "paint walls", "swim laps"]]
    assert (baker.gold, jellyfish.gold) == (0, 1)
    assert jellyfish.texts[1] == "Question: Where would you find a 'jellyfish'?\nAnswer: \nocean"


def test_csqa_in_context_examples_are_drawn_and_joined_as_opencompass_does():
    task = csqa_task(f"{CSQA}.fewshot_path={CSQA_TRAIN}", f"{CSQA}.num_fewshot=2")
    assert task.retriever == "random"                  # the default once a train file is given
    # OpenCompass's RandomRetriever: numpy's global seed, then one draw per question, in order
    np.random.seed(1)
    assert task.shots(3, 10) == [np.random.choice(10, 2, replace=False).tolist() for _ in range(3)] \
        == [[2, 9], [9, 5], [8, 3]]
    # each example a round, "Question: ...\nAnswer: " then its gold option, followed by the "\n"
    # separator and, after the last, the "\n" end token; every item joined by "\n" (a base model)
    assert task.instances()[0].texts[0] == (
        "Question: What does water become when it gets very cold?\nAnswer: \nice\n\n\n"
        "Question: What tells you the time on a kitchen wall?\nAnswer: \nclock\n\n\n\n\n"
        "Question: A lighthouse is useful for guiding ships at night, but it also serves as a landmark for what?"
        "\nAnswer: \nbank")
    texts = [inst.texts for inst in task.instances()]
    assert [inst.texts for inst in task.instances(2)] == texts[:2]       # limit does not change the draws
    assert [inst.texts for inst in csqa_task(f"{CSQA}.fewshot_path={CSQA_TRAIN}", f"{CSQA}.num_fewshot=2",
                                             f"{CSQA}.seed=2").instances()] != texts


def test_csqa_train_file_in_the_hubs_schema_gives_the_same_prompts(tmp_path):
    hub = tmp_path / "train.jsonl"
    hub.write_text("".join(json.dumps(doc) + "\n" for doc in read_question(CSQA_TRAIN)))
    assert "choices" in json.loads(hub.read_text().splitlines()[0])
    release, hub_copy = (csqa_task(f"{CSQA}.fewshot_path={path}") for path in (CSQA_TRAIN, hub))
    assert [i.texts for i in release.instances()] == [i.texts for i in hub_copy.instances()]
    assert release.instances()[0].texts[0].count("Question: ") == 9          # 8 examples by default


@pytest.mark.parametrize("overrides, match", [
    ([f"{CSQA}.retriever=mdl"], r"retriever='mdl'; valid: \['none', 'random'\].*MDL.*not reproduced"),
    ([f"{CSQA}.retriever=random"], "set fewshot_path=FILE"),
    ([f"{CSQA}.fewshot_path=/nope/train.jsonl"], "fewshot_path: '/nope/train.jsonl' does not exist"),
    ([f"{CSQA}.fewshot_path={CSQA_TRAIN}", f"{CSQA}.num_fewshot=11"],
     "holds 10 usable examples, fewer than num_fewshot=11"),
    ([f"{CSQA}.fewshot_path={RELEASE / 'commonsenseqa' / 'dev_rand_split.jsonl'}"], "is the evaluated file"),
])
def test_csqa_bad_in_context_options_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        csqa_task(*overrides)


def test_csqa_few_shot_values_equal_opencompass_get_ppl():
    tiny = load_tiny(name="tiny", config={**CONFIG, "max_position_embeddings": 2048})
    task = csqa_task(f"{CSQA}.fewshot_path={CSQA_TRAIN}", f"{CSQA}.num_fewshot=3")
    acc, _, records = score(tiny, task, batch_tokens=4096)
    assert all(text.count("Question: ") == 4 for r in records for text in r["texts"])
    assert acc == pytest.approx(sum(r["acc"] for r in records) / 3)
    assert_records_are_get_ppl(tiny, task, records)
