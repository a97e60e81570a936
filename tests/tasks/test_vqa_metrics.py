"""The answer scoring of the vision-language tasks against cases worked by hand from the official
rules (the VQA evaluation's answer processing and soft accuracy; lmms-eval's and LLaVA's ScienceQA parsers)."""

from __future__ import annotations

import pytest

from prunebench.tasks.generate_until import Request
from prunebench.tasks.scienceqa import ScienceQATask
from prunebench.tasks.vqa import (llava_scienceqa_answer, normalize_answer, scienceqa_exact_match,
                                  vqa_soft_accuracy)


@pytest.mark.parametrize("raw, normalised", [
    ("Two", "2"),  # number words to digits
    ("none", "0"),
    ("ten dogs", "10 dogs"),
    ("the dog", "dog"),  # articles dropped
    ("A Red Car.", "red car"),  # a final period dropped
    ("an apple a day", "apple day"),
    ("dont", "don't"),  # contractions restored
    ("isnt it", "isn't it"),
    ("Im", "im"),  # the table's capitalised keys never match the lower-cased text
    ("1.5", "1.5"),  # a period before a digit is a decimal point
    ("10,000", "10000"),  # commas go first
    ("black/white", "black white"),  # a mark between letters becomes a space
    ("black / white", "black white"),  # a mark beside a space is deleted
    ("hello-world!", "hello world"),
    ("man's hat", "man 's hat"),  # "'s" split off
    ("Unanswerable\n", "unanswerable"),
    ("yes?", "yes"),
])
def test_evalai_answer_normalisation(raw, normalised):
    assert normalize_answer(raw) == normalised


def annotators(matching: int, answer: str = "red", other: str = "blue") -> list[str]:
    return [answer] * matching + [other] * (10 - matching)


@pytest.mark.parametrize("matching, expected", [
    (0, 0.0),
    (1, 0.3),  # its annotator sees 0 others (0), each of the nine others sees 1 (1/3): 9/3 / 10
    (2, 0.6),  # two see 1 (1/3), eight see 2 (2/3): (2/3 + 16/3) / 10
    (3, 0.9),  # three see 2 (2/3), seven see 3 (1): (2 + 7) / 10
    (4, 1.0),  # everyone sees at least 3
    (10, 1.0),
])
def test_vqa_soft_accuracy_over_ten_annotators(matching, expected):
    assert vqa_soft_accuracy("red", annotators(matching)) == pytest.approx(expected, abs=1e-12)  # float sums


def test_vqa_soft_accuracy_normalises_both_sides():
    assert vqa_soft_accuracy("Two.", annotators(10, "2")) == 1.0
    assert vqa_soft_accuracy("the Red", ["red", "Red.", "a red", *["blue"] * 7]) == pytest.approx(0.9, abs=1e-12)
    assert vqa_soft_accuracy("red", []) == 0.0


@pytest.mark.parametrize("reply, target, score", [
    ("B", "B", 1.0), ("b", "B", 1.0), (" B\n", "B", 1.0),
    ("B. apostrophe", "B", 1.0), ("A. chiasmus", "B", 0.0),
    ("b. apostrophe", "B", 0.0),  # the "X." shape needs an upper-case letter
    ("The answer is B.", "B", 0.0),  # lmms-eval does not read this phrasing
    ("apostrophe", "B", 0.0),
])
def test_scienceqa_exact_match_as_lmms_eval(reply, target, score):
    assert scienceqa_exact_match(reply, target) == score


@pytest.mark.parametrize("reply, n_choices, answer", [
    ("B", 2, "B"), ("B. apostrophe", 2, "B"), ("The answer is B.", 2, "B"),
    ("B.", 2, "FAILED"),  # "X. " needs the space: three characters
    ("b", 2, "FAILED"),  # LLaVA's letters are upper-case only
    ("E", 2, "FAILED"),  # beyond the choices
    ("The answer is A. The answer is B.", 2, "FAILED"),  # more than one "The answer is"
    (" B", 2, "FAILED"),  # LLaVA strips the reply when writing it, not when parsing
])
def test_scienceqa_answer_as_llava_parses_it(reply, n_choices, answer):
    assert llava_scienceqa_answer(reply, n_choices) == answer


@pytest.mark.parametrize("reply, parsed", [
    (" B", "B"), ("B ", "B"), ("B\n", "B"), ("\nB", "B"),  # model_vqa_science.py strips the reply it writes
    ("B. ", "FAILED"),  # stripped to "B.", which eval_science_qa.py does not read
    ("B. apostrophe", "B"), ("A", "A"),
])
def test_scienceqa_llava_acc_strips_the_reply_as_llava_writes_it(reply, parsed):
    task = ScienceQATask(name="scienceqa_img", source=None, doc_to_text="{{text}}")
    request = Request(doc_id=0, requests=[], doc={"n_choices": 2}, task="scienceqa_img", target="B")
    answers, scores = task.score(reply, request)
    assert answers["llava_acc"] == parsed
    assert scores["llava_acc"] == float(parsed == "B")
