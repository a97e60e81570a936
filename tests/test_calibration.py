"""Calibration sources: deterministic windows per seed, each source's data layout, and the refusal
to calibrate on an evaluated split."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from conftest import MC_FIXTURE, compose_cfg, shared_file
from prunebench.calibration import (AlpacaCalibration, C4Calibration, FileCalibration, PromptCalibration,
                                    TaskCalibration, WikiText2Calibration, calibration_config)
from prunebench.corpora import Alpaca, WikiText2
from prunebench.models.tiny import tiny_tokenizer
from prunebench.validate import ConfigError, validate

SAMPLING = {"n_samples": 6, "seq_len": 24}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def wiki_lines(split: str, n: int = 12) -> list[str]:
    """WikiText-2 raw's shape: ' = Heading = ' lines and space-tokenised paragraphs."""
    lines = []
    for i in range(n):
        lines += [f" = {split.title()} article {i} = ",
                  f" The {split} article number {i} is about a quick brown fox , which jumps over "
                  f"{i + 2} lazy dogs in the year {1900 + i} . It was well received ."]
    return lines


@pytest.fixture
def data_dir(tmp_path):
    """A data_dir laid out like ../shared/data: wikitext2/wiki.test.raw only, CRLF line ends."""
    (tmp_path / "wikitext2").mkdir()
    (tmp_path / "wikitext2" / "wiki.test.raw").write_bytes("\r\n".join(wiki_lines("test")).encode() + b"\r\n")
    return tmp_path


def with_train(data_dir):
    (data_dir / "wikitext2" / "wiki.train.raw").write_text("\n".join(wiki_lines("train", 40)) + "\n")
    return data_dir


def test_windows_are_deterministic_per_seed_and_start_with_bos(data_dir, tokenizer):
    def make(seed):
        return WikiText2Calibration(split="train", data_dir=str(with_train(data_dir)), name="wikitext2", seed=seed,
                                    **SAMPLING).samples(tokenizer)
    first, again, other = make(0), make(0), make(1)
    assert first.shape == (6, 24) and first.dtype == torch.long
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert (first[:, 0] == tokenizer.bos_token_id).all()
    stream = tokenizer.encode((data_dir / "wikitext2" / "wiki.train.raw").read_text(), add_special_tokens=False)
    text = " ".join(map(str, stream))
    assert all(" ".join(map(str, row[1:].tolist())) in text for row in first)


def test_local_wikitext_reads_crlf_as_lf_and_names_a_missing_split(data_dir):
    text = WikiText2(split="test", data_dir=str(data_dir)).text()
    assert "\r" not in text and text.splitlines() == wiki_lines("test")
    with pytest.raises(FileNotFoundError, match=r"wiki\.train\.raw.*present: \['wiki\.test\.raw'\]"):
        WikiText2(split="train", data_dir=str(data_dir)).check()


def test_c4_takes_each_window_from_one_document_longer_than_it(tmp_path, tokenizer):
    docs = [{"text": f"short {i}", "timestamp": "2019", "url": "u"} for i in range(5)]
    docs += [{"text": " ".join(f"doc{i}word{j}" for j in range(60)), "timestamp": "2019", "url": "u"} for i in range(3)]
    path = tmp_path / "c4-train.00000-of-01024.json.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(d) for d in docs))
    samples = C4Calibration(path=str(path), name="c4", sampling="document", **SAMPLING).samples(tokenizer)
    long_docs = [" ".join(map(str, tokenizer.encode(d["text"], add_special_tokens=False))) for d in docs[5:]]
    for row in samples:
        assert any(" ".join(map(str, row[1:].tolist())) in doc for doc in long_docs)
    with pytest.raises(ValueError, match="no document is longer"):
        C4Calibration(path=str(path), name="c4", sampling="document", n_samples=2, seq_len=4096).samples(tokenizer)


def test_alpaca_prompts_use_the_template_without_responses(tmp_path):
    path = tmp_path / "alpaca_data_cleaned.json"
    path.write_text(json.dumps([{"instruction": "Name a color.", "input": "", "output": "Blue"},
                                {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}]))
    first, second = Alpaca(str(path)).documents()
    assert first.endswith("### Instruction:\nName a color.\n\n### Response:\n") and "Blue" not in first
    assert "### Input:\n2 and 3\n\n### Response:\n" in second and "5" not in second.split("### Input")[1][7:]
    assert AlpacaCalibration(path=str(path), name="alpaca", n_samples=2, seq_len=16).samples(tiny_tokenizer()).shape == (2, 16)


def test_mop_prompts_are_whole_prompts_in_the_released_template_one_per_batch(tmp_path, tokenizer):
    from prunebench.models.loaded import LoadedModel

    path = tmp_path / "alpaca_data_cleaned.json"
    path.write_text(json.dumps([{"instruction": f"Task {i}.", "input": "x y" if i % 2 else "", "output": "no"}
                                for i in range(10)]))
    assert Alpaca(str(path), template="mop").documents()[:2] == ["Instruction: Task 0.\nResponse:",
                                                                  "Instruction: Task 1.\nInput: x y\nResponse:"]
    calib = PromptCalibration(path=str(path), name="mop_prompts", n_samples=4, seq_len=64, seed=1)
    loaded = LoadedModel(model=torch.nn.Linear(1, 1), tokenizer=tokenizer, name="tiny", family="causal_lm",
                         max_length=64)
    batches = calib.batches(loaded, batch_size=8)
    texts = [tokenizer.decode(b["input_ids"][0], skip_special_tokens=True) for b in batches]
    assert len(batches) == 4 and len(set(texts)) == 4 and all(t.startswith("Instruction: Task") for t in texts)
    assert all(b["labels"] is b["input_ids"] and b["input_ids"].shape[0] == 1 for b in batches)
    again = [tokenizer.decode(b["input_ids"][0], skip_special_tokens=True) for b in calib.batches(loaded, 1)]
    assert again == texts


def test_mop_prompts_first_takes_the_first_prompts_in_order_as_the_released_llama3_code(tmp_path, tokenizer):
    from prunebench.models.loaded import LoadedModel

    path = tmp_path / "alpaca_data_cleaned.json"
    path.write_text(json.dumps([{"instruction": f"Task {i}.", "input": "", "output": "no"} for i in range(10)]))
    loaded = LoadedModel(model=torch.nn.Linear(1, 1), tokenizer=tokenizer, name="tiny", family="causal_lm",
                         max_length=64)

    def texts(seed):
        calib = PromptCalibration(path=str(path), name="mop_prompts", n_samples=3, seq_len=64, seed=seed, subset="first")
        return [tokenizer.decode(b["input_ids"][0], skip_special_tokens=True) for b in calib.batches(loaded, 1)]

    # load_prompts_from_dataset(..., random_subset=False): prompts[:max_prompts], whatever the seed
    assert texts(1) == texts(2) == [f"Instruction: Task {i}.\nResponse:" for i in range(3)]
    with pytest.raises(ValueError, match="subset"):
        PromptCalibration(path=str(path), name="mop_prompts", n_samples=3, seq_len=64, subset="last")


def test_the_mop_llama3_preset_calibrates_as_the_released_code():
    cfg = compose_cfg(["experiment=mop_llama3"])
    assert cfg.calib.subset == "first" and cfg.calib.n_samples == 128 and cfg.model.dtype == "bfloat16"
    assert compose_cfg(["experiment=mop_llama2"]).calib.subset == "random"


def test_file_reads_jsonl_records_field(tmp_path, tokenizer):
    path = tmp_path / "notes.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"note {i}: the quick brown fox"}) for i in range(20)))
    cal = FileCalibration(path=str(path), field="body", name="file", **SAMPLING)
    assert cal.corpus.documents()[3] == "note 3: the quick brown fox"
    assert cal.samples(tokenizer).shape == (6, 24)


def test_task_calibration_reads_contexts_with_gold_answers(tokenizer):
    cfg = compose_cfg(["calib=task", "task@calib.task=local_mc", f"calib.task.tasks.local_mc.source.path={MC_FIXTURE}"])
    from hydra.utils import instantiate

    cal = instantiate(calibration_config(cfg), _convert_="all")
    assert isinstance(cal, TaskCalibration)
    docs = cal.corpus.documents()
    first = json.loads(MC_FIXTURE.read_text().splitlines()[0])
    assert docs[0] == f"Question: {first['question']}\nAnswer: {first['choices'][first['label']]}"


def test_a_benchmark_chosen_for_calibration_is_its_definition_with_the_presets_values_over_it():
    """`task@calib.task=NAME` selects the task option; calibration takes its one definition, under the
    root config (data_dir reaches it), with what a preset sets beside it (glue_train's train split)."""
    cfg = compose_cfg(["model=tiny-bert-cls", "task=sst2", "calib=glue_train", "task@calib.task=cola", "data_dir=/glue"])
    assert list(cfg.calib.task.tasks) == ["cola"]
    task = calibration_config(cfg).task
    assert (task.name, task.source.task, task.source.split, task.source.data_dir) == ("cola", "cola", "train", "/glue")


def test_a_suite_chosen_for_calibration_is_refused_naming_the_spelling():
    cfg = compose_cfg(["model=tiny-llama", "pruner=wanda", "calib=task", "task@calib.task=glue"])
    with pytest.raises(ConfigError, match=r"calib.task='glue' holds 8 task definitions .* task@calib.task=NAME"):
        calibration_config(cfg)


PPL = ["model=tiny-llama", "task=wikitext2_ppl", "pruner=wanda", "calib.seq_len=64"]  # within its 256 positions


def test_calibrating_on_the_evaluated_split_is_refused_unless_allowed(data_dir):
    same = PPL + [f"++data_dir={data_dir}", "calib=wikitext2", "calib.split=test"]
    with pytest.raises(ConfigError, match="allow_eval_split"):
        validate(compose_cfg(same))
    validate(compose_cfg(same + ["calib.allow_eval_split=true"]))
    # the same file named as a plain file is the same data
    with pytest.raises(ConfigError, match="wiki.test.raw"):
        validate(compose_cfg(PPL + [f"++data_dir={data_dir}", "calib=file",
                                    f"calib.path={data_dir}/wikitext2/wiki.test.raw"]))
    validate(compose_cfg(PPL + [f"++data_dir={with_train(data_dir)}", "calib=wikitext2"]))


def test_a_task_evaluated_and_calibrated_on_the_same_file_is_refused():
    mc = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}", "pruner=wanda",
          "calib=task", "task@calib.task=local_mc"]
    with pytest.raises(ConfigError, match="evaluated"):
        validate(compose_cfg(mc + [f"calib.task.tasks.local_mc.source.path={MC_FIXTURE.parent}/../fixtures/{MC_FIXTURE.name}"]))


def test_missing_calibration_split_fails_before_any_model_loads(data_dir):
    with pytest.raises(ConfigError, match="wiki.train.raw"):
        validate(compose_cfg(PPL + [f"++data_dir={data_dir}", "calib=wikitext2"]))


@pytest.mark.shared_data
def test_shared_wikitext2_test_split_reads_as_documented():
    path = shared_file("wikitext2", "wiki.test.raw")
    text = WikiText2(split="test", data_dir=str(path.parent.parent)).text()
    lines = text.splitlines()
    # the byte-exact release file (SOURCES.md: 4358 lines, its blank ones too; the earlier copy held
    # its 2891 non-empty lines with CRLF)
    assert len(lines) == 4358 and "\r" not in text
    assert lines[1].strip() == "= Robert Boulter ="


@pytest.mark.parametrize("text", ["", "  \n\n\t\n"], ids=["empty", "blank"])
def test_an_empty_calibration_file_is_refused_before_the_model_loads(tmp_path, text):
    path = tmp_path / "calib.txt"
    path.write_text(text)
    cfg = compose_cfg(["model=tiny-llama", "pruner=wanda", "calib=file", f"calib.path={path}", "task=local_mc",
                       f"task.tasks.local_mc.source.path={MC_FIXTURE}"])
    with pytest.raises(ConfigError, match=r"calib.path=.*calib.txt' is empty: calibration windows are cut from its text"):
        validate(cfg)
