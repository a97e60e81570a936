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
from helpers.vlm_fixtures import write_vlm_data
from prunebench import job, pruning
from prunebench.paths import CONF_DIR
from prunebench.tracking.run_key import check_added_keys, undeclared
from prunebench.validate import ConfigError, validate

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


ALPACA = {"instruction": "Add the numbers.", "input": "2 and 2", "output": "4"}
RECOVERY = ["pruner=magnitude", "recovery=lora", "recovery.data=file", "recovery.path={tmp}/rec.jsonl",
            "recovery.batch_size=4", "recovery.micro_batch_size=4", "recovery.val_samples=1"]
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
    "dtype float8": ([json.dumps(GOOD)], ["model.dtype=float8"], ["model.dtype='float8'", "'auto'", "'bfloat16'"]),
    "dtype float8_e4m3fn": ([json.dumps(GOOD)], ["model.dtype=float8_e4m3fn"], ["model.dtype='float8_e4m3fn'", "'fp32'"]),
    "truncated model.safetensors": ([json.dumps(GOOD)], ["model=hf_causal", "model.path={tmp}/ckpt", "pruner=none"],
                                    ["model.path=", "model.safetensors (", "cut short", "file not fully covered"]),
    "truncated shard": ([json.dumps(GOOD)], ["model=hf_causal", "model.path={tmp}/ckpt", "pruner=none"],
                        ["model-00002-of-00002.safetensors (", "cut short"]),
    "shard missing": ([json.dumps(GOOD)], ["model=hf_causal", "model.path={tmp}/ckpt", "pruner=none"],
                      ["index.json names the shard model-00001-of-00002.safetensors", "not in the folder"]),
    "checkpoint without a tokenizer": ([json.dumps(GOOD)], ["model=hf_causal", "model.path={tmp}/ckpt", "pruner=none"],
                                       ["ckpt' holds no tokenizer", "tokenizer.json", "save_pretrained(FOLDER)"]),
    "export.dir under /proc": ([json.dumps(GOOD)], ["export=hf", "export.dir=/proc/prunebench-tests/models"],
                               ["export.dir='/proc/prunebench-tests/models'", "nothing can be written in /proc"]),
    "export.dir under a file": ([json.dumps(GOOD)], ["export=hf", "export.dir={tmp}/cases.jsonl/models"],
                                ["cases.jsonl is a file, not a folder"]),
    "seed not an integer for torch's generator": ([json.dumps(GOOD)], ["pruner=random", "seed=abc"],
                                                  ["pruner='random' is misconfigured: pruner random: seed='abc'",
                                                   "takes an integer"]),
    "num_fewshot over the few-shot split": (None, ["model=tiny-llama", "task=lm_eval", "task.lm_eval=[arc_easy]",
                                                   "pruner=none", "task.num_fewshot=3",
                                                   "+task.data_files.arc_easy.test={tmp}/test.jsonl",
                                                   "+task.data_files.arc_easy.train={tmp}/train.jsonl"],
                                            ["lm-eval task arc_easy", "num_fewshot=3", "('train') holds 2 document(s)",
                                             "use num_fewshot=2 or fewer"]),
    # the checks the config and the model's config decide (tiny-llama: 2 blocks, 4 heads, 256 positions)
    "OWL lamda past any outlier ratios": ([json.dumps(GOOD)], ["pruner=owl", "pruner.lamda=5", "calib=file",
                                                               "calib.path={tmp}/cases.jsonl", "calib.field=question"],
                                          ["pruner.lamda=5.0 at sparsity=0.5 over 2 pruned blocks", "at least 5.5000",
                                           "lower lamda below 0.5"]),
    "OWL skip_layers past the model's blocks": ([json.dumps(GOOD)], ["pruner=owl", "pruner.skip_layers=[7]",
                                                                     "calib=file", "calib.path={tmp}/cases.jsonl",
                                                                     "calib.field=question"],
                                                ["pruner.skip_layers=[7]", "blocks 0..1, not [7]"]),
    "wanda skip_layers past the model's blocks": ([json.dumps(GOOD)], ["pruner=magnitude", "pruner.skip_layers=[0,2]"],
                                                  ["pruner.skip_layers=[0, 2]", "blocks 0..1, not [2]"]),
    "FLAP removing more heads than the model has": ([json.dumps(GOOD)], ["pruner=flap", "pruner.structure=AL-MM",
                                                                          "pruner.remove_heads=1000", "calib=file",
                                                                          "calib.path={tmp}/cases.jsonl",
                                                                          "calib.field=question"],
                                                    ["remove_heads=1000", "more than the model's 4 key/value groups (2 layers x 2)"]),
    "REAP removing no expert": ([json.dumps(GOOD)], ["model=tiny-mixtral", "pruner=reap", "sparsity=0.1", "calib=file",
                                                     "calib.path={tmp}/cases.jsonl", "calib.field=question"],
                                ["sparsity=0.1 removes int(8 x 0.1) = 0 of the 8 experts", "sparsity=0.125"]),
    # recovery (a pruned job that recovers: tiny-llama, 10 alpaca records, one batch of 4 besides 1 held out)
    "recovery LoRA target matching no module": ([json.dumps(GOOD)], [*RECOVERY, "recovery.lora.targets=[foo]"],
                                                ["recovery.lora.targets=['foo']: ['foo'] name(s) no module of "
                                                 "model='tiny-llama'", "'q_proj'"]),
    "recovery schedule unknown": ([json.dumps(GOOD)], [*RECOVERY, "recovery.schedule=bogus"],
                                  ["recovery.schedule='bogus'", "transformers' schedules", "'cosine'"]),
    "recovery template unknown": ([json.dumps(GOOD)], [*RECOVERY, "recovery.template=bogus"],
                                  ["recovery.template='bogus'", "'alpaca'", "'mop'"]),
    "recovery betas out of range": ([json.dumps(GOOD)], [*RECOVERY, "recovery.betas=[2,0.9]"],
                                    ["recovery.betas=[2, 0.9]", "two numbers in [0, 1)"]),
    "recovery negative weight decay": ([json.dumps(GOOD)], [*RECOVERY, "recovery.weight_decay=-1"],
                                       ["recovery.weight_decay=-1", "0 or more"]),
    "recovery LoRA rank 0": ([json.dumps(GOOD)], [*RECOVERY, "recovery.lora.r=0"], ["recovery.lora.r=0", "positive"]),
    "recovery negative warmup": ([json.dumps(GOOD)], [*RECOVERY, "recovery.warmup_steps=-5"],
                                 ["recovery.warmup_steps=-5", "0 or more"]),
    "recovery negative max_grad_norm": ([json.dumps(GOOD)], [*RECOVERY, "recovery.max_grad_norm=-1"],
                                        ["recovery.max_grad_norm=-1", "null turns clipping off"]),
    "recovery max_steps past any training": ([json.dumps(GOOD)], [*RECOVERY, "recovery.max_steps=1000000000000"],
                                             ["recovery.max_steps=1000000000000", "would not end"]),
    "recovery text in Latin-1": ([json.dumps(GOOD)], [*RECOVERY, "recovery.path={tmp}/latin1.txt"],
                                 ["recovery.path=", "latin1.txt, line 2 (byte 12 of the file): not UTF-8",
                                  "b'\\xe9'", "iconv"]),
    "recovery text binary": ([json.dumps(GOOD)], [*RECOVERY, "recovery.path={tmp}/weights.bin"],
                             ["recovery.path=", "weights.bin, line 2 (byte 128 of the file): not UTF-8"]),
    "recovery records in a corrupt .jsonl.gz": ([json.dumps(GOOD)], [*RECOVERY, "recovery.path={tmp}/rec.jsonl.gz"],
                                                ["recovery.path=", "rec.jsonl.gz' cannot be read as gzip",
                                                 "a corrupt or cut .gz file"]),
    "recovery text empty": ([json.dumps(GOOD)], [*RECOVERY, "recovery.path={tmp}/empty.txt"],
                            ["recovery.path=", "empty.txt' is empty: recovery windows"]),
    "recovery on the evaluated documents": ([json.dumps(GOOD)] * 12,
                                            ["pruner=magnitude", "recovery=lora", "recovery.data=task",
                                             "+task@recovery.task=local_mc",
                                             "recovery.task.tasks.local_mc.source.path={tmp}/cases.jsonl", "recovery.batch_size=4",
                                             "recovery.micro_batch_size=4", "recovery.val_samples=1"],
                                            ["recovery.data=task trains on data that is evaluated", "local_mc",
                                             "recovery.allow_eval_split=true"]),
    "num_fewshot negative": (None, ["model=tiny-llama", "task=lm_eval", "task.lm_eval=[arc_easy]", "pruner=none",
                                    "task.num_fewshot=-1", "+task.data_files.arc_easy.test={tmp}/test.jsonl",
                                    "+task.data_files.arc_easy.train={tmp}/train.jsonl"],
                             ["task.num_fewshot=-1", "0 or more"]),
    # HF_HUB_OFFLINE=1 (OFFLINE below) and a hub dataset in no cache
    "offline wikitext2 task not in the cache": (None, ["model=tiny-llama", "task=wikitext2_ppl", "pruner=none"],
                                                ["'wikitext'", "HF_HUB_OFFLINE=1 while no cache holds it", "data_dir"]),
    "offline wikitext2 calibration not in the cache": ([json.dumps(GOOD)], ["pruner=wanda", "calib=wikitext2"],
                                                       ["'wikitext'", "HF_HUB_OFFLINE=1 while no cache holds it"]),
    "offline alpaca recovery not in the cache": ([json.dumps(GOOD)], ["pruner=magnitude", "recovery=lora"],
                                                 ["recovery.data=alpaca", "HF_HUB_OFFLINE=1 while no cache holds it",
                                                  "recovery.data=file recovery.path=FILE"]),
    # the docs' own data: ../shared/data has wiki.test.raw and wiki.valid.raw, no wiki.train.raw
    "wikitext2 train missing for calibration": ([json.dumps(GOOD)], ["pruner=wanda", "calib=wikitext2",
                                                                     "data_dir={tmp}/data"],
                                                ["wiki.train.raw' does not exist", "present: ['wiki.test.raw', "
                                                 "'wiki.valid.raw']", "calib.split=validation",
                                                 "recovery.data=file recovery.path=FILE"]),
    "wikitext2 train missing for recovery": ([json.dumps(GOOD)], ["pruner=magnitude", "recovery=lora",
                                                                  "recovery.data=wikitext2", "data_dir={tmp}/data"],
                                             ["wiki.train.raw' does not exist", "recovery.data=file recovery.path=FILE"]),
}
OFFLINE = {name for name in CASES if name.startswith("offline ")}
# files a case writes beside its task file (under {tmp}, which its overrides name); None: a real PNG
RECOVERY_FILES = {"rec.jsonl": "".join(json.dumps(ALPACA) + "\n" for _ in range(10)).encode(),
                  "latin1.txt": "one line\ncaf\xe9 au lait\n".encode("latin-1"), "weights.bin": bytes(range(256)) * 8,
                  "rec.jsonl.gz": b"\x1f\x8b\x08\x00 not gzip after its magic", "empty.txt": b""}
SHARED_WIKITEXT = {"data/wikitext2/wiki.test.raw": b" = Test = \n", "data/wikitext2/wiki.valid.raw": b" = Valid = \n"}
FILES = {**{name: RECOVERY_FILES for name in CASES if name.startswith("recovery ")},
         **{name: SHARED_WIKITEXT for name in CASES if name.startswith("wikitext2 train missing")},
         "model.path an empty folder": {"empty/": None},
         "0-byte image": vizwiz({"a.png": None, "b.png": b""}),
         "unreadable image": vizwiz({"a.png": None, "c.jpg": b"<html>not a picture</html>"})}

def checkpoint(folder: Path, shards: int = 1, tokenizer: bool = True) -> list[Path]:
    """A checkpoint folder as from_pretrained reads it (config.json, safetensors, maybe shards and their
    index, a tokenizer); its weights are never loaded here, so they are a few zeros. Returns the weight files."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=64).save_pretrained(folder)
    names = (["model.safetensors"] if shards == 1
             else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)])
    for i, name in enumerate(names):
        save_file({f"w{i}": torch.zeros(256)}, folder / name)
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {f"w{i}": name for i, name in enumerate(names)}}))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")  # only its presence is looked at before loading
    return [folder / name for name in names]


def cut(path: Path) -> None:
    """The file without its last 100 bytes: a download cut short."""
    path.write_bytes(path.read_bytes()[:-100])


def arc_files(tmp) -> None:
    """ARC-Easy in the hub's schema: 3 test documents, 2 train documents (its few-shot split)."""
    def arc(i: int) -> str:
        return json.dumps({"id": f"q{i}", "question": f"Question {i}?", "answerKey": "A",
                           "choices": {"text": ["yes", "no"], "label": ["A", "B"]}})
    (tmp / "test.jsonl").write_text("".join(arc(i) + "\n" for i in range(3)))
    (tmp / "train.jsonl").write_text("".join(arc(i) + "\n" for i in (10, 11)))


# cases whose files a test helper writes
WRITERS = {"judge server refusing connections": write_vlm_data,
           "truncated model.safetensors": lambda tmp: cut(checkpoint(tmp / "ckpt")[0]),
           "truncated shard": lambda tmp: cut(checkpoint(tmp / "ckpt", shards=2)[1]),
           "shard missing": lambda tmp: checkpoint(tmp / "ckpt", shards=2)[0].unlink(),
           "checkpoint without a tokenizer": lambda tmp: checkpoint(tmp / "ckpt", tokenizer=False),
           "num_fewshot over the few-shot split": arc_files, "num_fewshot negative": arc_files}


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
    monkeypatch.setattr(pruning, "get_model", refuse)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_before_any_model_loads(name, store, tmp_path, no_model, monkeypatch):
    overrides = case_overrides(name, tmp_path)
    if name in OFFLINE:  # no network, and caches that hold nothing
        from datasets import config
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    with pytest.raises(ConfigError) as err:
        job.run(compose_cfg([*overrides, "trainer.enable_progress_bar=false"]), overrides)
    for word in CASES[name][2]:
        assert word in str(err.value), str(err.value)
    assert "\n" not in str(err.value), str(err.value)
    assert_no_runs(store)


def test_every_case_has_its_row_in_the_measured_table_of_docs_errors_md():
    """scripts/error_cases.py runs these cases through the CLI; a case added without its row there is
    a refusal whose message no reader of the docs sees."""
    table = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text().partition("## The cases, measured")[2]
    rows = {line.split(" | ")[0].removeprefix("| ") for line in table.splitlines() if line.startswith("| ")}
    assert [name for name in CASES if name not in rows] == []


@pytest.mark.process
def test_unknown_experiment_is_refused_like_an_unknown_task(store):
    proc = subprocess.run([sys.executable, "-m", "prunebench", *TINY_MC[:1], "experiment=nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "experiment/nope" in proc.stderr + proc.stdout


@pytest.mark.process
def test_unknown_tracking_scheme_fails_the_sweep_with_one_clear_line(store):
    """The sweep's parent run is made before any job: the address is checked there too."""
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *TINY_MC, "tracking.uri=garbage://x",
                           "sparsity=0.3,0.5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]  # a usage error, as a single job's refusal
    assert "tracking.uri='garbage://x'" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")))
def test_the_root_keys_an_experiment_sets_are_defined(option):
    """An experiment's own root keys (hies_vit's vision_data) are the config's, not a typo's."""
    assert undeclared(compose_cfg([f"experiment={option}"])) == []


@pytest.mark.parametrize("extra", [["+model.device_map=auto"], ["++data_dir=/tmp"], ["seed=3"],
                                   ["recovery=lora", "recovery.data=task", "+task@recovery.task=local_mc"]])
def test_plus_overrides_under_a_defined_root_key_pass(extra):
    check_added_keys(compose_cfg(extra), extra)


@pytest.mark.process
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

    from prunebench.models.checks import model_context

    LlamaConfig(max_position_embeddings=64).save_pretrained(tmp_path)
    assert model_context(compose_cfg(["model=hf_causal", f"model.path={tmp_path}"]).model) == 64
    assert model_context(compose_cfg(["model=hf_causal", f"model.path={tmp_path}", "model.max_length=32"]).model) == 32
    assert model_context(compose_cfg(["model=tiny-llava"]).model) == 256


LONG = {**GOOD, "question": "word " * 400}  # over tiny-llama's 256 positions


def test_truncated_prompts_are_counted_and_warned_once_per_task(store, tmp_path, caplog):
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD), json.dumps(LONG), json.dumps(LONG)])
    with caplog.at_level(logging.WARNING, logger="prunebench.evaluation.evaluate"):
        metrics = job.run(compose_cfg([*mc(path), "pruner=none", "trainer.enable_progress_bar=false"]))
    assert metrics["local_mc/n_truncated"] == 2
    warned = [r.getMessage() for r in caplog.records if "cut from the left" in r.getMessage()]
    assert len(warned) == 1 and "local_mc: 2 of 3 documents" in warned[0] and "256 positions" in warned[0], warned


def test_a_generation_prompt_cut_to_leave_room_is_counted(tmp_path):
    from hydra.utils import instantiate

    from prunebench.evaluation.generation.engine import GenerationDataModule
    from prunebench.tasks.generate_until import GenerateUntilTask
    from prunebench.tasks.sources import JsonSource

    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD), json.dumps(LONG)])
    task = GenerateUntilTask(name="g", source=JsonSource(path), doc_to_text="{{question}}", doc_to_target="{{label}}",
                             max_gen_toks=8)
    data = GenerationDataModule(task, instantiate(compose_cfg(["model=tiny-llama"]).model))
    data.setup("test")
    assert data.truncated == 1
    assert max(len(item.tokens) for batch in data.batches for item in batch) == 256 - 8


def assert_no_runs(store: str) -> None:
    experiment = mlflow.MlflowClient(store).get_experiment_by_name("prunebench")
    assert experiment is None or not mlflow.MlflowClient(store).search_runs([experiment.experiment_id])


def test_a_cache_that_cannot_be_written_is_refused_before_any_model_loads(store, tmp_path, no_model, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", "/proc/prunebench-tests/cache")
    cfg = compose_cfg(mc(write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD)])))
    with pytest.raises(ConfigError, match=r"^PRUNEBENCH_CACHE='/proc/prunebench-tests/cache': nothing can be written "
                                          r"in /proc .*set PRUNEBENCH_CACHE to a folder this process can write"):
        job.run(cfg)
    assert_no_runs(store)


def test_a_sound_checkpoint_folder_passes(tmp_path):
    """The checks refuse only what from_pretrained would: sharded or not, with its tokenizer."""
    from prunebench.models.checkpoint_folder import check_checkpoint_folder

    checkpoint(tmp_path / "one")
    checkpoint(tmp_path / "sharded", shards=3)
    for folder in ("one", "sharded"):
        check_checkpoint_folder(str(tmp_path / folder))
    (tmp_path / "one" / "tokenizer.json").unlink()
    check_checkpoint_folder(str(tmp_path / "one"), trust_remote_code=True)  # its own code may read its own files


def test_legal_but_suspect_input_is_warned_about_once_and_the_job_runs(store, tmp_path, caplog):
    """seed=abc (Python's random seeds with the string's SHA-512), a document id twice, a choice twice."""
    docs = [{**GOOD, "id": "a"}, {**GOOD, "id": "b", "choices": ["4", "5", "4"]}, {**GOOD, "id": "a"}]
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(d) for d in docs])
    with caplog.at_level(logging.WARNING):
        metrics = job.run(compose_cfg([*mc(path), "pruner=none", "seed=abc", "trainer.enable_progress_bar=false"]))
    assert metrics["local_mc/n_docs"] == 3
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    seed = [m for m in warned if m.startswith("seed='abc' is not an integer")]
    ids = [m for m in warned if "repeat the 'id' of an earlier one" in m]
    choices = [m for m in warned if "list a choice twice" in m]
    assert len(seed) == len(ids) == len(choices) == 1, warned
    assert "SHA-512" in seed[0]
    assert "task local_mc: 1 document(s)" in ids[0] and "'a' at documents 0 and 2" in ids[0], ids
    assert "document 1: choices 0 and 2 are both '4'" in choices[0], choices


def test_an_lm_eval_task_with_a_repeated_id_is_warned_about(tmp_path, caplog):
    arc_files(tmp_path)
    (tmp_path / "test.jsonl").write_text((tmp_path / "test.jsonl").read_text() * 2)
    cfg = compose_cfg(["model=tiny-llama", "task=lm_eval", "task.lm_eval=[arc_easy]", "pruner=none",
                       f"+task.data_files.arc_easy.test={tmp_path}/test.jsonl"])
    with caplog.at_level(logging.WARNING, logger="prunebench.tasks.duplicates"):
        validate(cfg)
    assert [r.getMessage() for r in caplog.records] == [
        "task arc_easy: 3 document(s) of lm-eval's test split repeat the 'id' of an earlier one ('q0' at documents 0 and "
        "3; 'q1' at documents 1 and 4; 'q2' at documents 2 and 5); each copy is scored and counted: remove the "
        "repeats if the file was read or joined twice"]


@pytest.mark.process
def test_a_truncated_checkpoint_exits_2_with_one_line_and_no_run(store, tmp_path):
    cut(checkpoint(tmp_path / "ckpt")[0])
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD)])
    proc = subprocess.run([sys.executable, "-m", "prunebench", *mc(path, "model=hf_causal", f"model.path={tmp_path}/ckpt",
                                                                   "pruner=none")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("prunebench: invalid config: model.path="), proc.stderr[-2000:]
    assert "model.safetensors (" in lines[0] and "cut short" in lines[0]
    assert "HYDRA_FULL_ERROR" not in proc.stderr + proc.stdout
    assert_no_runs(store)


@pytest.mark.process
def test_an_unwritable_export_dir_refuses_the_sweep_once_before_any_job(store, tmp_path):
    """Not each pruned job and its dense baseline evaluated, then failing at the write."""
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps(GOOD)])
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *mc(path), "sparsity=0.3,0.5", "export=hf",
                           "export.dir=/proc/prunebench-tests/models", "trainer.enable_progress_bar=false"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("export.dir='/proc/prunebench-tests/models': nothing can be written in /proc") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr[-2000:]
    assert_no_runs(store)


@pytest.mark.process
def test_the_old_export_spellings_are_refused_naming_the_new_ones(store):
    """export=true, export_dir and export_padded became the group `export`: Hydra's own refusal of a
    bool group choice names neither the key nor what replaced it, so the command says both, in one line."""
    proc = subprocess.run([sys.executable, "-m", "prunebench", *TINY_MC[:1], "export=true", "export_dir=/tmp/x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "prunebench: invalid config: export=true: export is a config group now; write export=hf to write the model "
        "(export=none, the default, writes none) (docs/export.md)"], proc.stderr[-2000:]
    assert_no_runs(store)


def test_calibration_windows_past_the_models_positions_are_said_before_it_loads(tmp_path, caplog):
    path = write_jsonl(tmp_path / "cases.jsonl", [json.dumps(GOOD)])
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg(mc(path, "pruner=wanda", "calib=file", f"calib.path={path}", "calib.field=question",
                                "calib.seq_len=100000", "calib.allow_eval_split=true")))
    assert "calib.seq_len=100000 is beyond model='tiny-llama''s 256 positions" in caplog.text
    assert "calib.seq_len=256 or less" in caplog.text
