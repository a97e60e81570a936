"""What a recovery trains on, as token examples {input_ids, labels}, and the checks that refuse bad
data before any model loads.

Two shapes of data, as the released recipes read them:
- instruction records {instruction, input, output} (alpaca-cleaned, a local JSON/JSONL): each record
  in Stanford Alpaca's template with its response appended, cut at `seq_len`, EOS appended where it
  fits, the prompt's labels ignored unless `train_on_inputs` (LLM-Pruner's post_training.py);
- text (WikiText-2's train split, a plain-text file, a task's documents): windows of `seq_len`
  tokens, consecutive, or `n_samples` at random starts per seed (SliceGPT's run_finetuning.py)."""

from __future__ import annotations

import copy
import gzip
import json
import random
import zlib
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.api.errors import ConfigError
from prunebench.api.task_keys import chosen_definition
from prunebench.calibration import Calibration
from prunebench.corpora import (ALPACA_HUB, ALPACA_TEMPLATES, Alpaca, TaskText, TextFile, WikiText2, data_id, is_json,
                                load_rows)
from prunebench.evaluation.encoding import window_prefix
from prunebench.hub import HubUnreachable, deferring

DATA = ("alpaca", "file", "wikitext2", "task")
RECORD_KEYS = ("instruction", "output")
IGNORED = -100  # the label torch's cross-entropy (and transformers' loss) skips


def read_records(path: Path) -> list:
    """The records of a .json (one list) or .jsonl (one per line) file, .gz too; ValueError naming
    the line that is not JSON."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"recovery.path={str(path)!r}: byte {err.start} of its text is not UTF-8 ({err.reason}: "
                         f"{err.object[err.start:err.end]!r}); records must be UTF-8 (convert it, e.g. iconv -f latin1 "
                         f"-t utf-8)") from None
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError; a cut file ends in EOFError
        raise ValueError(f"recovery.path={str(path)!r} cannot be read as gzip ({type(err).__name__}: {err}): a "
                         f"corrupt or cut .gz file; compress it again, or give the plain .json/.jsonl") from None
    if ".jsonl" in path.suffixes:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"recovery.path={str(path)!r} line {number} is not JSON ({err.msg})") from None
        return records
    try:
        records = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as err:
        raise ValueError(f"recovery.path={str(path)!r} is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(records, list):
        raise ValueError(f"recovery.path={str(path)!r} holds a JSON {type(records).__name__}, not a list of "
                         f"{{instruction, input, output}} records")
    return records


def check_records(records: list, path: str) -> None:
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or not all(isinstance(record.get(key), str) for key in RECORD_KEYS):
            shown = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"recovery.path={path!r} record {number} has {shown}; each record needs string fields "
                             f"{list(RECORD_KEYS)} (and optionally input): the alpaca schema")


class RecoveryData:
    """`options`: the resolved `recovery` config; `task`: the task definition data=task reads."""

    def __init__(self, options: dict, data_dir: str | None = None, task=None):
        self.options, self.data_dir, self.task = options, data_dir, task
        self.kind = options["data"]
        if self.kind not in DATA:
            raise ValueError(f"recovery.data={self.kind!r}; valid: {list(DATA)}")
        if self.kind == "file" and not options.get("path"):
            raise ValueError("recovery.data=file needs recovery.path=FILE (JSON/JSONL alpaca records, or plain text)")
        if self.kind == "task" and task is None:
            raise ValueError("recovery.data=task needs a task definition: +task@recovery.task=NAME "
                             "recovery.task.tasks.NAME.source.path=TRAIN_FILE (a split that is not evaluated)")

    @property
    def path(self) -> Path | None:
        return Path(self.options["path"]).expanduser() if self.kind == "file" else None

    def records_file(self) -> bool:
        return self.kind == "alpaca" or (self.kind == "file" and is_json(self.path))

    def corpus(self):
        """The text that windows are cut from (None for instruction records)."""
        if self.kind == "wikitext2":
            return WikiText2("train", self.data_dir)
        if self.kind == "task":
            return TaskText(self.task)
        return None if self.records_file() else TextFile(str(self.path), option="recovery.path", use="recovery windows")

    def data_ids(self) -> set[str]:
        if self.kind == "alpaca":
            return {f"hf:{ALPACA_HUB}"}
        if self.kind == "file":
            return {data_id(str(self.path))}
        return self.corpus().data_ids()

    def check(self) -> None:
        """Before any model loads: the data exists (a hub dataset is asked for once, hub.py), is not
        empty, has the alpaca schema where it is records, and holds one batch besides the held-out
        examples. Text is counted here at one byte a token at most (its tokens are not known before
        the tokenizer loads); `examples` counts them again once they are."""
        if self.kind == "alpaca":
            try:
                Alpaca().check()
            except HubUnreachable as err:  # the generic text names data_dir, which alpaca never reads
                reason = str(err).partition(" was not reached by one request ")[2] or "no answer"
                offline = "HF_HUB_OFFLINE=1 while no cache holds it" in str(err)
                raise HubUnreachable(f"recovery.data=alpaca reads the hub dataset {ALPACA_HUB!r}, and " + (
                                     "HF_HUB_OFFLINE=1 while no cache holds it" if offline else
                                     f"the hub was not reached by one request {reason.split('; without network')[0]}") +
                                     "; without network "
                                     "give its records as a file: recovery.data=file recovery.path=FILE (e.g. "
                                     "alpaca_data_cleaned.json: a JSON list of {instruction, input, output})") from None
            return
        if self.kind != "file":
            self.corpus().check()
            return
        path = self.path
        if not path.is_file():
            raise FileNotFoundError(f"recovery.path={str(path)!r} does not exist; give a JSON/JSONL file of alpaca "
                                    f"records {{instruction, input, output}}, or a plain-text file")
        if not self.records_file():
            self.corpus().check()  # refuses an empty file, or one that is not UTF-8
            windows = path.stat().st_size // (self.options["seq_len"] - 1)
            self.check_count(self.options["n_samples"] or windows, f"at most {windows} windows of "
                             f"recovery.seq_len={self.options['seq_len']} tokens")
            return
        records = read_records(path)
        if not records:
            raise ValueError(f"recovery.path={str(path)!r} holds no records; give alpaca records "
                             f"{{instruction, input, output}}")
        check_records(records, str(path))
        self.check_count(len(records), f"{len(records)} records")

    def check_count(self, count: int, what: str) -> None:
        held, batch = self.options["val_samples"], self.options["batch_size"]
        if count - held < batch:
            raise ValueError(f"recovery.path={str(self.path)!r} has {what}: fewer than one batch "
                             f"(recovery.batch_size={batch}) besides the recovery.val_samples={held} held out; give "
                             f"more data, or lower recovery.batch_size / recovery.val_samples")

    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        if self.records_file():
            rows = read_records(self.path.resolve()) if self.kind == "file" else load_rows(ALPACA_HUB)
            if self.kind == "file":
                check_records(rows, str(self.path))
            made = [self.instruction_example(tokenizer, row) for row in rows]
            kept = [e for e in made if any(label != IGNORED for label in e["labels"][1:])]
            self.dropped = len(made) - len(kept)
            return kept
        return self.windows(tokenizer)

    def instruction_example(self, tokenizer, row: dict) -> dict[str, list[int]]:
        """LLM-Pruner's tokenisation: the whole text cut at seq_len, EOS appended where it fits; without
        `train_on_inputs`, the prompt's positions (as the prompt alone tokenises) get no label. An
        example whose prompt fills seq_len has no label left and is dropped by `examples`."""
        options = self.options
        template = ALPACA_TEMPLATES[options["template"]]
        prompt = template[bool(row.get("input"))].format(instruction=row["instruction"], input=row.get("input", ""))
        ids = tokenizer(prompt + row["output"], truncation=True, max_length=options["seq_len"])["input_ids"]
        if tokenizer.eos_token_id is not None and ids[-1] != tokenizer.eos_token_id and len(ids) < options["seq_len"]:
            ids.append(tokenizer.eos_token_id)
        labels = list(ids)
        if not options["train_on_inputs"]:
            prompt_len = len(tokenizer(prompt, truncation=True, max_length=options["seq_len"])["input_ids"])
            labels[:prompt_len] = [IGNORED] * min(prompt_len, len(labels))
        return {"input_ids": ids, "labels": labels}

    def windows(self, tokenizer) -> list[dict[str, list[int]]]:
        """Consecutive windows of the text (each starting with the BOS evaluation gives a window), or
        `n_samples` at random starts drawn per seed, by calibration's own sampler."""

        options, corpus = self.options, self.corpus()
        if options["n_samples"] and options.get("windows") == "disjoint":
            windows = disjoint_windows(corpus.documents(), tokenizer, options["n_samples"], options["seq_len"],
                                       options["seed"])
            return [{"input_ids": w, "labels": w} for w in windows]
        if options["n_samples"]:
            windows = Calibration(corpus, f"recovery {self.kind}", options["n_samples"], options["seq_len"],
                                  options["seed"]).samples(tokenizer)
        else:
            return [{"input_ids": w, "labels": w} for w in streamed_windows(corpus, tokenizer, options["seq_len"])]
        return [{"input_ids": w, "labels": w} for w in windows.tolist()]

    def split(self, examples: list) -> tuple[list, list]:
        """(train, validation): `val_samples` held out at random per seed, as LLM-Pruner's
        train_test_split holds out its validation set. ValueError when the rest is under one batch."""
        held, batch = self.options["val_samples"], self.options["batch_size"]
        if len(examples) - held < batch:
            dropped = getattr(self, "dropped", 0)
            why = (f"; {dropped} record(s) were dropped because their prompt fills recovery.seq_len="
                   f"{self.options['seq_len']} tokens, leaving no response token to learn (the prompt's labels are "
                   f"ignored): raise recovery.seq_len, or set recovery.train_on_inputs=true" if dropped else "")
            raise ValueError(f"recovery data {sorted(self.data_ids())}: {len(examples)} examples of "
                             f"recovery.seq_len={self.options['seq_len']} tokens leave fewer than one batch "
                             f"(recovery.batch_size={batch}) besides the recovery.val_samples={held} held out{why}")
        order = list(range(len(examples)))
        random.Random(self.options["seed"]).shuffle(order)
        return [examples[i] for i in order[held:]], [examples[i] for i in order[:held]]


def streamed_windows(corpus, tokenizer, seq_len: int) -> list[list[int]]:
    """Consecutive windows as `token_windows` cuts the whole text's tokens (BOS first, then seq_len
    minus that many tokens, each token once, the last partial window dropped), the text tokenized a
    piece at a time (`TextFile.pieces`): tokenized whole, a large text's every token and the
    tokenizer's buffers for all of it were held at once; a piece's tokens are kept only until its
    windows are cut."""
    prefix = window_prefix(tokenizer)
    step = seq_len - len(prefix)
    pieces = corpus.pieces() if hasattr(corpus, "pieces") else [corpus.text()]
    windows, pending = [], []
    for piece in pieces:
        pending += tokenizer.encode(piece, add_special_tokens=False)
        whole = len(pending) // step * step
        windows += [prefix + pending[start:start + step] for start in range(0, whole, step)]
        del pending[:whole]
    return windows


def disjoint_windows(documents: list[str], tokenizer, count: int, seq_len: int, seed: int) -> list[list[int]]:
    """Windows as SliceGPT's `prepare_dataloader` cuts them: from a line drawn at random among those
    not used yet, that line and the ones after it joined by a blank line until `seq_len` tokens
    (BOS first, as evaluation's windows start); the lines read are used up whether or not they made a
    window (a run that reaches the text's end short of `seq_len` makes none). Until `count` windows, or
    until no line is left: WikiText-2's train split gives about 1.2k windows of 2048 Llama tokens."""
    import torch

    prefix = window_prefix(tokenizer)
    lines = [line for document in documents for line in document.splitlines(keepends=True) if line]
    generator = torch.Generator().manual_seed(seed)
    free, windows = list(range(len(lines))), []
    while len(windows) < count and free:
        start = int(torch.randint(0, len(free), (1,), generator=generator))
        ids, end = list(prefix), start
        while len(ids) < seq_len and end < len(free):
            ids += tokenizer.encode(("\n\n" if end > start else "") + lines[free[end]], add_special_tokens=False)
            end += 1
        del free[start:end]
        if len(ids) >= seq_len:
            windows.append(ids[:seq_len])
    return windows


def recovery_data(cfg: DictConfig, deferred: list[str] | None = None) -> RecoveryData:
    """The recovery's data, its options checked (not the data itself: `check_recovery`)."""
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    task = None
    if options["data"] == "task" and cfg.recovery.get("task") is not None:
        recovery = copy.deepcopy(cfg.recovery)  # still under the root config, so `${data_dir}` resolves
        with open_dict(recovery):
            try:
                recovery.task = chosen_definition(recovery.task, "recovery.task")
            except ValueError as err:
                raise ConfigError(str(err)) from None
        with deferring(deferred):
            task = instantiate(recovery.task, _convert_="all")
    try:
        return RecoveryData(options, cfg.get("data_dir"), task)
    except ValueError as err:
        raise ConfigError(str(err)) from None
