"""Bad input is refused before any model loads, naming the file, line or document and the value;
no run is left RUNNING (docs/errors.md lists the cases and their messages)."""

from __future__ import annotations

import io
import logging
import json
import subprocess
import sys

from pathlib import Path

import mlflow
import pytest

from conftest import TINY_MC, compose_cfg
from vlm_fixtures import write_vlm_data
from prunebench import job
from prunebench.paths import CONF_DIR
from prunebench.validate import ConfigError, check_root_keys

GOOD = {"question": "2+2?", "choices": ["4", "5"], "label": 0}


def write_jsonl(path, lines: list[str | bytes]) -> str:
    """`bytes` lines are written as they are (a file that is not UTF-8)."""
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return str(path)


def mc(path: str, *extra: str) -> list[str]:
    return ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={path}", *extra]


def png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(out, format="PNG")
    return out.getvalue()


def vizwiz(image_dir_files: dict[str, bytes | None]) -> dict[str, bytes | None]:
    """A VizWiz file in its schema asking about each picture, and the pictures (None: a PNG)."""
    rows = [{"question": f"What is {n}?", "image": n, "answers": ["x"]} for n in image_dir_files]
    return {"val.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode(),
            **{f"images/{n}": data for n, data in image_dir_files.items()}}


VIZWIZ = ["model=tiny-llava", "task=vizwiz_vqa", "pruner=none", "task.tasks.vizwiz_vqa.source.path={tmp}/val.jsonl",
          "task.tasks.vizwiz_vqa.image_dir={tmp}/images"]


CASES = {
    # name: (lines of the task file or None, overrides after the file's, words the message must hold)
    "malformed second line": ([json.dumps(GOOD), '{"question": "x", "choices": ["a", "b"], "label": 0'],
                              [], ["line 2, column", "cases.jsonl"]),
    "gold out of range": ([json.dumps(GOOD), json.dumps({**GOOD, "label": 5})], [], ["document 1", "5", "2 choices"]),
    "negative gold": ([json.dumps({**GOOD, "label": -1})], [], ["document 0", "-1"]),
    "empty choice list": ([json.dumps({**GOOD, "choices": []})], [], ["document 0", "no choices"]),
    "empty file": ([], [], ["cases.jsonl", "no documents"]),
    "missing template field": ([json.dumps({"choices": ["a", "b"], "label": 0})], [], ["document 0", "question"]),
    "text task on a vision model": ([json.dumps(GOOD)], ["model=tiny-vit", "pruner=none"],
                                    ["loglikelihood requests", "tiny-vit", "vision"]),
    "image task on a text model": (None, ["model=tiny-llama", "task=easy_vqa", "pruner=none"],
                                   ["with images", "tiny-llama", "vlm"]),
    "not UTF-8": ([json.dumps(GOOD), '{"question": "caf\xe9?", "choices": ["a", "b"], "label": 0}'.encode("latin-1")],
                  [], ["cases.jsonl, line 2, column 18 (byte 73 of the file)", "not UTF-8", "b'\\xe9'"]),
    "choices a string": ([json.dumps(GOOD), json.dumps({**GOOD, "choices": "45"})], [],
                         ["document 1 of", "cases.jsonl", "doc_to_choice='{{choices}}' gave 45", "a JSON list"]),
    "unknown tracking scheme": ([json.dumps(GOOD)], ["tracking.uri=garbage://x"], ["tracking.uri='garbage://x'"]),
    "root key added with +": ([json.dumps(GOOD)], ["+sparsty=0.3"],
                              ["+sparsty=0.3", "no root key 'sparsty'", "did you mean 'sparsity'"]),
    "model.path an empty folder": ([json.dumps(GOOD)], ["model=hf_causal", "model.path={tmp}/empty"],
                                   ["model.path=", "empty' is a folder without config.json"]),
    "model.path missing": ([json.dumps(GOOD)], ["model=hf_causal", "model.path=/nonexistent/llama"],
                           ["model.path='/nonexistent/llama': no such folder", "config.json", "not of a hub id's shape"]),
    "max_gen_toks over the context": (None, ["model=tiny-llava", "task=easy_vqa", "pruner=none",
                                             "task.tasks.easy_vqa.max_gen_toks=300"],
                                      ["task easy_vqa: max_gen_toks=300", "model='tiny-llava''s 256 positions"]),
    "judge server refusing connections": (None, ["model=tiny-llava", "task=llava_bench_wild", "pruner=none",
                                                 "data_dir={tmp}", "task.tasks.llava_bench_wild.image_dir={tmp}/images",
                                                 "task.tasks.llava_bench_wild.max_gen_toks=8", "judge=openai_compatible",
                                                 # port 9 (discard): nothing listens on it
                                                 "judge.url=http://127.0.0.1:9/v1", "judge.model=test-judge",
                                                 "judge.api_key_env=null"],
                                          ["task llava_bench_wild's judge (test-judge): judge.url='http://127.0.0.1:9/v1': "
                                           "no connection", "start the judge server"]),
    "0-byte image": (None, VIZWIZ, ["task vizwiz_vqa: 1 image(s) cannot be read", "images/b.png (0 bytes)"]),
    "unreadable image": (None, VIZWIZ, ["1 image(s) cannot be read", "images/c.jpg (not an image PIL can read"]),
}
# files a case writes beside its task file (under {tmp}, which its overrides name); None: a real PNG
FILES = {"model.path an empty folder": {"empty/": None},
         "0-byte image": vizwiz({"a.png": None, "b.png": b""}),
         "unreadable image": vizwiz({"a.png": None, "c.jpg": b"<html>not a picture</html>"})}

# cases whose files a test helper writes
WRITERS = {"judge server refusing connections": write_vlm_data}


def case_overrides(name: str, tmp) -> list[str]:
    """The case's files written under `tmp`, and its overrides."""
    lines, extra, _ = CASES[name]
    if name in WRITERS:
        WRITERS[name](tmp)
    for relative, data in FILES.get(name, {}).items():
        if relative.endswith("/"):  # a folder, left empty
            (tmp / relative).mkdir(parents=True, exist_ok=True)
            continue
        (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp / relative).write_bytes(png() if data is None else data)
    extra = [e.format(tmp=tmp) for e in extra]
    return mc(write_jsonl(tmp / "cases.jsonl", lines), *extra) if lines is not None else extra


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a job that should have been refused")
    monkeypatch.setattr(job, "get_model", refuse)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_before_any_model_loads(name, store, tmp_path, no_model):
    overrides = case_overrides(name, tmp_path)
    with pytest.raises(ConfigError) as err:
        job.run(compose_cfg([*overrides, "trainer.enable_progress_bar=false"]))
    for word in CASES[name][2]:
        assert word in str(err.value), str(err.value)
    experiment = mlflow.MlflowClient(store).get_experiment_by_name("prunebench")
    assert experiment is None or not mlflow.MlflowClient(store).search_runs([experiment.experiment_id])


def test_unknown_experiment_is_refused_like_an_unknown_task(store):
    proc = subprocess.run([sys.executable, "-m", "prunebench", *TINY_MC[:1], "experiment=nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "experiment/nope" in proc.stderr + proc.stdout


def test_unknown_tracking_scheme_fails_the_sweep_with_one_clear_line(store):
    """The sweep's parent run is made before any job: the address is checked there too."""
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *TINY_MC, "tracking.uri=garbage://x",
                           "sparsity=0.3,0.5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "tracking.uri='garbage://x'" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")))
def test_the_root_keys_an_experiment_sets_are_defined(option):
    """An experiment's own root keys (hies_vit's vision_data) are the config's, not a typo's."""
    check_root_keys(compose_cfg([f"experiment={option}"]))


@pytest.mark.parametrize("extra", [["+model.device_map=auto"], ["++data_dir=/tmp"], ["seed=3"],
                                   ["task=commonsense", "+task_library@task.tasks.openbookqa=openbookqa"]])
def test_plus_overrides_under_a_defined_root_key_pass(extra):
    check_root_keys(compose_cfg(extra))


def test_a_config_error_prints_once_without_a_traceback_and_exits_2(store, tmp_path):
    path = write_jsonl(tmp_path / "cases.jsonl", [json.dumps({**GOOD, "label": 5})])
    proc = subprocess.run([sys.executable, "-m", "prunebench", *mc(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("the gold answer 5 is not one of its 2 choices") == 1, proc.stderr


def test_a_hub_id_without_the_hub_says_it_was_taken_as_one(store, tmp_path, no_model, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cfg = compose_cfg(mc(write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD)]), "model=hf_causal",
                         "model.path=prunebench-tests/no-such-model"))
    with pytest.raises(ConfigError, match=r"model.path='prunebench-tests/no-such-model' is no local folder, so it "
                                          r"was taken as a hub id; its config.json is not in the Hugging Face cache .* "
                                          r"HF_HUB_OFFLINE=1"):
        job.run(cfg)


def test_the_context_is_read_from_config_json_or_model_max_length(tmp_path):
    from transformers import LlamaConfig

    from prunebench.validate import model_context

    LlamaConfig(max_position_embeddings=64).save_pretrained(tmp_path)
    assert model_context(compose_cfg(["model=hf_causal", f"model.path={tmp_path}"]).model) == 64
    assert model_context(compose_cfg(["model=hf_causal", f"model.path={tmp_path}", "model.max_length=32"]).model) == 32
    assert model_context(compose_cfg(["model=tiny-llava"]).model) == 256


LONG = {**GOOD, "question": "word " * 400}  # over tiny-llama's 256 positions


def test_truncated_prompts_are_counted_and_warned_once_per_task(store, tmp_path, caplog):
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD), json.dumps(LONG), json.dumps(LONG)])
    with caplog.at_level(logging.WARNING, logger="prunebench.job"):
        metrics = job.run(compose_cfg([*mc(path), "pruner=none", "trainer.enable_progress_bar=false"]))
    assert metrics["local_mc/n_truncated"] == 2
    warned = [r.getMessage() for r in caplog.records if "cut from the left" in r.getMessage()]
    assert len(warned) == 1 and "local_mc: 2 of 3 documents" in warned[0] and "256 positions" in warned[0], warned


def test_a_generation_prompt_cut_to_leave_room_is_counted(tmp_path):
    from hydra.utils import instantiate

    from prunebench.evaluation.generation import GenerationDataModule
    from prunebench.tasks.generation import GenerateUntilTask
    from prunebench.tasks.sources import JsonSource

    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD), json.dumps(LONG)])
    task = GenerateUntilTask(name="g", source=JsonSource(path), doc_to_text="{{question}}", doc_to_target="{{label}}",
                             max_gen_toks=8)
    data = GenerationDataModule(task, instantiate(compose_cfg(["model=tiny-llama"]).model))
    data.setup("test")
    assert data.truncated == 1
    assert max(len(item.tokens) for batch in data.batches for item in batch) == 256 - 8
