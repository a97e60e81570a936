"""Recovery inputs past the table of tests/test_bad_input.py: a large text read in pieces, the
warnings for options that do nothing, the reason no instruction example is left, and recovery on a
mixture-of-experts model (its fused expert parameters trained without dropout)."""

from __future__ import annotations

import json
import logging
import tracemalloc

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY_MC, compose_cfg
from prunebench.corpora import TextFile
from prunebench.evaluation.perplexity.windows import token_windows
from prunebench.models.tiny import tiny_tokenizer
from prunebench.recovery.data import recovery_data, streamed_windows
from prunebench.validate import validate

ALPACA = {"instruction": "Add the numbers.", "input": "2 and 2", "output": "4"}


class CharTokenizer:
    """One token a character, BOS first: cheap enough to read megabytes in a test; records the
    longest text it was given."""

    bos_token_id, eos_token_id = 1, 2
    longest = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.longest = max(self.longest, len(text))
        return [3 + ord(c) % 200 for c in text]

    def __call__(self, text, **kwargs):
        return {"input_ids": [1, *self.encode(text)]}


def transient_bytes(windows) -> tuple[int, int]:
    """(Python memory at the peak of `windows()` beyond what the windows it returns keep, their count)."""
    tracemalloc.start()
    try:
        made = windows()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - kept, len(made)


WORDS = "lorem ipsum dolor sit amet "


def one_line_text(folder, megabytes: int):
    """A text of about `megabytes` MB with no line end at all: what a reader of lines would take whole."""
    path = folder / f"one_line_{megabytes}.txt"
    path.write_text(WORDS * (megabytes * (1 << 20) // len(WORDS)))
    return path


def test_a_one_line_text_is_tokenized_in_pieces_whatever_its_size(tmp_path, monkeypatch):
    import prunebench.recovery.data as data

    monkeypatch.setattr(data, "window_prefix", lambda tokenizer: [1])
    sizes = {}
    for megabytes in (1, 4):
        path = one_line_text(tmp_path, megabytes)
        tokenizer = CharTokenizer()
        extra, count = transient_bytes(lambda: streamed_windows(TextFile(str(path), option="recovery.path"),
                                                                tokenizer, 128))
        assert count == path.stat().st_size // 127
        assert tokenizer.longest <= (1 << 20) + len(WORDS)  # a piece, never the whole text
        sizes[megabytes] = extra
    # tokenized whole, the 4 MB text's token list alone was 4x the 1 MB one's: here the transient
    # memory is a piece's, the same at both sizes
    assert sizes[4] < 1.5 * sizes[1] + (4 << 20), sizes


def test_pieces_give_the_windows_of_the_whole_text(tmp_path):
    text = "".join(f"Line {i}: the quick brown fox, café {i * 7}.\n" for i in range(300))
    path = tmp_path / "lines.txt"
    path.write_text(text)
    tokenizer = tiny_tokenizer()
    whole = token_windows(tokenizer.encode(text, add_special_tokens=False), 32, [tokenizer.bos_token_id]).tolist()
    corpus = TextFile(str(path), option="recovery.path")
    corpus.pieces = lambda size=512, original=corpus.pieces: original(size)  # many pieces
    assert len(list(corpus.pieces())) > 10
    assert streamed_windows(corpus, tokenizer, 32) == whole


def test_random_windows_of_a_large_one_line_text_are_cut_in_pieces_whatever_its_size(tmp_path, monkeypatch):
    """recovery.n_samples on a text file: its windows at random starts, as calibration draws them."""
    import prunebench.calibration as calibration

    monkeypatch.setattr(calibration, "window_prefix", lambda tokenizer: [1])
    sizes = {}
    for megabytes in (2, 20):
        path = one_line_text(tmp_path, megabytes)
        cfg = compose_cfg([*TINY_MC, "pruner=magnitude", "recovery=lora", "recovery.data=file", f"recovery.path={path}",
                           "recovery.n_samples=16", "recovery.seq_len=128"])
        tokenizer = CharTokenizer()
        extra, count = transient_bytes(lambda: recovery_data(cfg).examples(tokenizer))
        assert count == 16
        assert tokenizer.longest <= (1 << 20) + len(WORDS)  # a piece, never the whole text
        sizes[megabytes] = extra
    # tokenized whole, the peak grew with the text (19 MB for 2 MB, 202 MB for 20 MB); in pieces it is
    # two pieces' tokens and a piece's text at either size (28.5 MB both), so only how far a list had
    # grown when the peak came can part them: a margin of half
    assert sizes[20] < 1.5 * sizes[2], sizes


def test_random_windows_from_pieces_are_those_of_the_whole_text(tmp_path):
    import random

    from prunebench.calibration import Calibration

    text = "".join(f"Line {i}: the quick brown fox, café {i * 7}.\n" for i in range(300))
    path = tmp_path / "lines.txt"
    path.write_text(text)
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(3)  # the draw calibration made on the whole text's tokens
    whole = [[tokenizer.bos_token_id, *ids[s:s + 31]] for s in (rng.randrange(0, len(ids) - 31) for _ in range(40))]
    corpus = TextFile(str(path), option="recovery.path")
    corpus.pieces = lambda size=512, original=corpus.pieces: original(size)  # many pieces
    assert len(list(corpus.pieces())) > 10
    assert Calibration(corpus, "recovery file", 40, 32, seed=3).samples(tokenizer).tolist() == whole


def records(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_options_that_do_nothing_are_warned_about(tmp_path, caplog):
    path = records(tmp_path / "rec.jsonl", [ALPACA] * 10)
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg([*TINY_MC, "pruner=magnitude", "recovery=lora", "recovery.data=file",
                              f"recovery.path={path}", "recovery.batch_size=4", "recovery.micro_batch_size=4",
                              "recovery.val_samples=1", "recovery.n_samples=8", "recovery.max_steps=10",
                              "recovery.warmup_steps=0", "recovery.val_every=50", "recovery.early_stopping_patience=2"]))
    assert "recovery.n_samples=8 is read only for text" in caplog.text
    assert "recovery.val_every=50 is beyond recovery.max_steps=10" in caplog.text
    assert "early_stopping_patience=2 never stops anything" in caplog.text


def test_records_whose_prompt_fills_seq_len_say_why_no_example_is_left(tmp_path):
    long = {**ALPACA, "instruction": "Add the numbers, carefully and step by step. " * 10}
    path = records(tmp_path / "rec.jsonl", [long] * 10)
    cfg = compose_cfg([*TINY_MC, "pruner=magnitude", "recovery=lora", "recovery.data=file", f"recovery.path={path}",
                       "recovery.batch_size=4", "recovery.micro_batch_size=4", "recovery.val_samples=1",
                       "recovery.seq_len=16"])
    data = recovery_data(cfg)
    with pytest.raises(ValueError, match=r"0 examples .* 10 record\(s\) were dropped because their prompt fills "
                                         r"recovery.seq_len=16 tokens.*recovery.train_on_inputs=true"):
        data.split(data.examples(tiny_tokenizer()))


@pytest.mark.parametrize("objective", ["lora", "distill"])
def test_recovery_trains_a_mixture_of_experts_with_dropout_on_its_attention(tmp_path, objective, one_thread):
    from prunebench.pruning import prune
    from prunebench.recovery.train import adapted, recover

    path = tmp_path / "recovery.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    cfg = compose_cfg([*TINY_MC, "model=tiny-qwen3-moe", "pruner=magnitude", "sparsity=0.3", f"recovery={objective}",
                       "recovery.data=file", f"recovery.path={path}", "recovery.seq_len=32", "recovery.batch_size=4",
                       "recovery.micro_batch_size=2", "recovery.val_samples=4", "recovery.warmup_steps=0",
                       "recovery.max_steps=2"])
    validate(cfg)
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    assert options["lora"]["dropout"] > 0
    loaded, _, _, _ = prune(cfg, dense=False)
    teacher = None
    if objective == "distill":
        from prunebench.models.cache import get_model

        teacher = get_model(cfg.model).model
    wrapped = adapted(loaded.model, options)
    trained = {name for name, p in wrapped.named_parameters() if p.requires_grad}
    assert any(".experts." in name for name in trained) and any("q_proj.lora_A" in name for name in trained)
    dropouts = {name: m.p for name, m in wrapped.named_modules() if isinstance(m, torch.nn.Dropout) and "lora_dropout" in name}
    assert dropouts and all(p == options["lora"]["dropout"] for p in dropouts.values()), dropouts
    wrapped.unload()  # the adapters off again: recover wraps the model itself
    loaded, _, _, _ = prune(cfg, dense=False)
    metrics, _ = recover(loaded, options, recovery_data(cfg), cfg.trainer, teacher=teacher)
    assert metrics["recovery/steps"] == 2
    assert type(loaded.model).__name__ == "Qwen3MoeForCausalLM"  # merged: no adapter left
