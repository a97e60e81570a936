"""BIG-bench task JSON -> documents in the hails/bigbench shape lm-eval reads."""

from conftest import FIXTURES
from prunebench.tasks.multiple_choice import MultipleChoiceTask
from prunebench.tasks.sources import BigBenchSource, bigbench_docs

TEMPLATES = dict(doc_to_text="inputs", doc_to_choice="{{multiple_choice_targets}}",
                 doc_to_target="{{multiple_choice_scores.index(1)}}")


def test_default_bigbench_formatting_lists_choices():
    docs = BigBenchSource("tiny_knowledge", path=str(FIXTURES / "bigbench" / "task.json")).load()
    assert len(docs) == 4
    assert docs[0]["inputs"] == "Q: How many legs do horses have?\n  choice: two\n  choice: four\n  choice: six\nA:"
    assert docs[1]["multiple_choice_scores"] == [0, 1, 0, 0]


def test_prefixes_and_no_choice_listing_are_honoured():
    spec = {"name": "t", "task_prefix": "Answer T or F.", "append_choices_to_input": False,
            "example_output_prefix": "\nVerdict:\n",
            "examples": [{"input": "Fish fly.", "target_scores": {"T": 0, "F": 1}},
                         {"input": "free text", "target": "only generative"}]}
    docs = bigbench_docs(spec)
    assert [d["inputs"] for d in docs] == ["Answer T or F.\nQ: Fish fly.\nVerdict:\n"]


def test_task_builds_lm_eval_requests_from_bigbench_docs():
    task = MultipleChoiceTask(name="bb", source=BigBenchSource("t", path=str(FIXTURES / "bigbench" / "task.json")),
                              primary="acc", **TEMPLATES)
    inst = task.instances(limit=2)[1]
    assert inst.contexts == [inst.contexts[0]] * 4 and inst.contexts[0].endswith("\nA:")
    assert inst.continuations == [" London", " Paris", " Rome", " Berlin"]
    assert inst.gold == 1 and inst.choice_lengths == [6, 5, 4, 6]
