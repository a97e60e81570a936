"""lm-eval's doc_to_* resolution, checked on values written out by hand."""

import pytest

from prunebench.tasks.template import gold_index, resolve, resolve_choices, resolve_target

DOC = {"question": "It's \"odd\"?", "choices": {"text": ["it's", 'say "hi"', "x\ny"], "label": ["A", "B", "C"]},
       "answerKey": "B", "label": "1", "stem": "The sun is  "}


def test_field_name_is_verbatim_not_stripped():
    assert resolve("stem", DOC) == "The sun is  "


def test_template_renders_and_keeps_trailing_newline():
    assert resolve("Question: {{question}}\nAnswer:", DOC) == "Question: It's \"odd\"?\nAnswer:"
    assert resolve("X.\n\n", DOC) == "X.\n\n"


def test_list_template_round_trips_quotes_and_newlines():
    assert resolve_choices("{{choices.text}}", DOC) == ["it's", 'say "hi"', "x\ny"]


def test_digit_target_becomes_int_and_label_lookup_works():
    assert resolve_target("{{label}}", DOC) == 1
    assert resolve_target("{{choices.label.index(answerKey)}}", DOC) == 1
    assert gold_index(resolve_target("answerKey", DOC), ["A", "B", "C"]) == 1


def test_out_of_range_or_unknown_gold_scores_wrong():
    assert gold_index(7, ["a", "b"]) == -100
    assert gold_index("z", ["a", "b"]) == -100


def test_templates_render_in_a_sandbox():
    from jinja2.exceptions import SecurityError

    assert resolve("{{ question.split('?')[0] }}", {"question": "Why? Because"}) == "Why"
    with pytest.raises(SecurityError):
        resolve("{{ question.__class__.__mro__[1].__subclasses__() }}", {"question": "q"})
