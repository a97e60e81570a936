"""BBH: answer filters on hand-written responses, prompts per variant and protocol from small
fixture files in BBH's schema, config validation, and whole jobs on a tiny model."""

from __future__ import annotations

import json

import mlflow
import pytest

from conftest import FIXTURES, compose_cfg, shared_file
from prunebench.job import run
from prunebench.tasks.bbh import (SUBTASKS, MappedAnswer, NumberAnswer, OpenCompassFreeform, OpenCompassOption,
                                  OptionLetter, SortedWords, bbh, read_exemplars)
from prunebench.validate import ConfigError, validate

DATA = FIXTURES / "bbh"
DATE_DOC = {"input": "What is the date?\nOptions:\n(A) 02/29/2020\n(B) 02/28/2020, a Friday\n(C) Unknown."}
TINY_BBH = ["model=tiny-llama", "pruner=none", "trainer.enable_progress_bar=false", f"++data_dir={DATA}",
            "limit=2"]


@pytest.mark.parametrize("response, answer", [
    (" (B) because (A) is wrong", "(B)"),
    (" It is 02/28/2020 a friday.", "(B)"),          # option text, case and punctuation ignored
    (" the answer is unknown", "(C)"),
    (" Answer: A", "(A)"),                          # a letter after a colon
    (" no idea", "[invalid]"),
])
def test_option_letter_filter_branches(response, answer):
    assert OptionLetter()(response, DATE_DOC) == answer


def test_number_filter_reads_digits_then_english_number_words():
    assert NumberAnswer()(" I count -3 or 4", {}) == "-3"
    assert NumberAnswer()(" Twenty one apples", {}) == "21"
    assert NumberAnswer()(" several", {}) == "[invalid]"


def test_mapped_filter_takes_the_first_phrase_and_maps_it_by_pattern_order():
    sports = SUBTASKS["sports_understanding"].answer
    assert sports(" This is not plausible.", {}) == "no"
    assert sports(" Plausible, yes", {}) == "yes"
    lies = SUBTASKS["web_of_lies"].answer
    assert lies(" So Bob is telling the truth", {}) == "yes"
    assert MappedAnswer({r"\b(a)\b": "x"})(" b", {}) == "[invalid]"


def test_word_sort_filter_keeps_each_listed_word_at_its_last_occurrence():
    doc = {"input": "Sort the following words alphabetically: List: pear apple fig"}
    assert SortedWords()(" fig apple pear fig", doc) == "apple pear fig"


def test_opencompass_postprocessors():
    assert OpenCompassOption()("... So the answer is (C).", {}) == "C"
    assert OpenCompassOption()("(B)", {}) == "B"
    assert OpenCompassOption()("the answer is c", {}) == "c"
    assert OpenCompassFreeform()("Thus. So the answer is **No**.\nQ: more", {}) == "No"
    assert OpenCompassFreeform()(" 24.", {}) == "24"


def test_exemplars_are_read_from_a_prompt_file_and_from_the_hf_schema(tmp_path):
    shots = read_exemplars(DATA / "bbh" / "cot-prompts" / "date_understanding.txt")
    assert [s["target"] for s in shots] == ["(A)", "(B)", "(A)"]
    assert shots[2]["cot"].startswith("One week after")         # the cue and reasoning share a line
    assert shots[0]["answer"] == "Let's think step by step.\nThe date is given as 01/02/2000. So the answer is (A)."
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"input": "x", "target": "y. So the answer is z."}]))
    assert read_exemplars(path) == [{"input": "x", "answer": "Let's think step by step.\ny. So the answer is z.",
                                     "cot": "y. So the answer is z.", "target": "z"}]


def test_prompts_of_each_variant_and_protocol():
    def first(variant, protocol="lm_eval"):
        group = bbh("g", variant, protocol, subtasks=["boolean_expressions"], data_dir=str(DATA))
        return group.tasks[0], group.tasks[0].instances(1)[0]

    task, request = first("zeroshot")
    assert request.prompt == "Evaluate the result of a random Boolean expression.\n\nQ: not True or False is\nA:"
    assert (task.until, task.max_gen_toks, task.metrics) == (["</s>", "Q:", "<|im_end|>"], 256,
                                                             ["exact_match", "exact_match_strict"])
    task, request = first("fewshot")
    assert request.prompt.endswith("Q: not ( True ) or True is\nA: True\n\nQ: not True or False is\nA:")
    task, request = first("cot_fewshot")
    assert request.prompt.endswith("So the answer is True.\n\nQ: not True or False is\nA: Let's think step by step.\n")
    assert task.max_gen_toks == 1024
    task, request = first("cot_fewshot", "opencompass")
    assert request.prompt.startswith("Follow the given examples and answer the question.\nEvaluate the result")
    assert request.prompt.endswith("So the answer is True.\n\nQ: not True or False is\nA: Let's think step by step.")
    assert (task.until, task.max_gen_toks) == ([], 512)
    task, request = first("zeroshot", "opencompass")
    assert request.prompt == ("Question: not True or False is\n You must give your final answer by starting with "
                              "'So the answer is' ")


def test_opencompass_scores_option_letters_and_raw_free_form_answers():
    group = bbh("g", "zeroshot", "opencompass", subtasks=["date_understanding", "boolean_expressions"],
                data_dir=str(DATA))
    assert not group.weight_by_size
    date, boolean = group.tasks
    request = date.instances(1)[0]                                     # target "(A)"
    assert date.score("So the answer is (A).", request)[1] == {"exact_match": 1.0}
    request = boolean.instances(1)[0]                                  # target "False"
    assert boolean.score("So the answer is False.", request)[1] == {"exact_match": 1.0}
    assert boolean.score("So the answer is false.", request)[1] == {"exact_match": 0.0}


def test_bad_choices_are_config_errors_before_any_model_loads():
    with pytest.raises(ConfigError, match="OpenCompass has no plain few-shot"):
        validate(compose_cfg(TINY_BBH + ["task=bbh_fewshot", "task.protocol=opencompass"]))
    with pytest.raises(ConfigError, match="unknown BBH subtasks"):
        validate(compose_cfg(TINY_BBH + ["task=bbh_zeroshot", "task.tasks.bbh_zeroshot.subtasks=[nope]"]))
    with pytest.raises(ConfigError, match="does not exist"):   # the fixture has 2 of the 27 subtasks
        validate(compose_cfg(TINY_BBH + ["task=bbh_zeroshot"]))
    with pytest.raises(ConfigError, match="prompt file"):
        validate(compose_cfg(TINY_BBH + ["task=bbh_fewshot", "task.tasks.bbh_fewshot.subtasks=[navigate]",
                                         "task.tasks.bbh_fewshot.source=bigbench"]))
    with pytest.raises(ConfigError, match="programmatic"):
        validate(compose_cfg(TINY_BBH + ["task=bbh_zeroshot", "task.tasks.bbh_zeroshot.subtasks=[web_of_lies]",
                                         "task.tasks.bbh_zeroshot.source=bigbench"]))


@pytest.mark.parametrize("suite, protocol", [("bbh_zeroshot", "lm_eval"), ("bbh_zeroshot", "opencompass"),
                                             ("bbh_cot_fewshot", "opencompass")])
def test_job_logs_subtask_and_group_scores_and_the_protocol(store, suite, protocol):
    metrics = run(compose_cfg(TINY_BBH + [f"task={suite}", f"task.protocol={protocol}",
                                          f"task.tasks.{suite}.subtasks=[boolean_expressions,date_understanding]",
                                          f"task.tasks.{suite}.max_gen_toks=8"]))
    names = [f"{suite}_boolean_expressions/exact_match", f"{suite}_date_understanding/exact_match",
             f"{suite}/exact_match", f"{suite}/exact_match_stderr", "avg/score"]
    assert all(name in metrics for name in names)
    assert metrics["avg/score"] == metrics[f"{suite}/exact_match"]
    assert (f"{suite}/exact_match_strict" in metrics) == (suite == "bbh_zeroshot" and protocol == "lm_eval")
    df = mlflow.search_runs(experiment_names=["prunebench"])
    assert df["tags.prunebench.protocol"].tolist() == [protocol]


@pytest.mark.shared_data
def test_every_subtask_loads_from_the_shared_bbh_files():
    data = shared_file("bbh").parent
    for variant in ("zeroshot", "fewshot", "cot_fewshot"):
        group = bbh("g", variant, data_dir=str(data))
        group.check()
        sizes = [len(t.docs()) for t in group.tasks]
        assert sum(sizes) == 6511 and len(sizes) == 27


@pytest.mark.shared_data
def test_opencompass_hint_is_the_prompt_file_without_its_canary_header():
    data = shared_file("bbh").parent
    group = bbh("g", "cot_fewshot", "opencompass", data_dir=str(data))
    for name, task in zip(SUBTASKS, group.tasks):
        body = (data / "bbh" / "cot-prompts" / f"{name}.txt").read_text(encoding="utf-8").split("-----\n", 1)[1]
        assert task.description == f"Follow the given examples and answer the question.\n{body}\n\n", name
