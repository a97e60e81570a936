"""What a recovery trains on, as token examples {input_ids, labels}, and the checks that refuse bad
data before any model loads. Each `recovery.data` kind is a `RecoveryData` subclass: prunebench's
by name in `KINDS`, a lab's by `_target_` (docs/architecture.md), so a new kind touches no code here.

Two shapes of data, as the released recipes read them:
- instruction records {instruction, input, output} (alpaca-cleaned, a local JSON/JSONL): each record
  in Stanford Alpaca's template with its response appended, cut at `seq_len`, EOS appended where it
  fits, the prompt's labels ignored unless `train_on_inputs` (LLM-Pruner's post_training.py);
- text (WikiText-2's train split, a plain-text file, a task's documents): windows of `seq_len`
  tokens, consecutive, or `n_samples` at random starts per seed (SliceGPT's run_finetuning.py)."""

from __future__ import annotations

import copy
import gzip
import importlib
import json
import random
import zlib
from abc import ABC, abstractmethod
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.api.errors import ConfigError
from prunebench.api.task_keys import chosen_definition
from prunebench.calibration import Calibration, piece_tokens
from prunebench.corpora import (ALPACA_HUB, ALPACA_TEMPLATES, Alpaca, TaskText, TextFile, WikiText2, data_id, is_json,
                                load_rows)
from prunebench.evaluation.encoding import window_prefix
from prunebench.hub import HubUnreachable, deferring

RECORD_KEYS = ("instruction", "output")
IGNORED = -100  # the label torch's cross-entropy (and transformers' loss) skips


def read_records(path: Path, schema: str = "{instruction, input, output}") -> list:
    """The records of a .json (one list) or .jsonl (one per line) file, .gz too; ValueError naming
    the line that is not JSON. `schema`: what a record holds, in words, for a file that is no list."""
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
                         f"{schema} records")
    return records


def check_records(records: list, path: str) -> None:
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or not all(isinstance(record.get(key), str) for key in RECORD_KEYS):
            shown = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"recovery.path={path!r} record {number} has {shown}; each record needs string fields "
                             f"{list(RECORD_KEYS)} (and optionally input): the alpaca schema")


def streamed_windows(corpus, tokenizer, seq_len: int) -> list[list[int]]:
    """Consecutive windows as `token_windows` cuts the whole text's tokens (BOS first, then seq_len
    minus that many tokens, each token once, the last partial window dropped), the text tokenized a
    piece at a time (`TextCorpus.pieces`): tokenized whole, a large text's every token and the
    tokenizer's buffers for all of it were held at once; a piece's tokens are kept only until its
    windows are cut."""
    prefix = window_prefix(tokenizer)
    step = seq_len - len(prefix)
    windows, pending = [], []
    for ids in piece_tokens(corpus, tokenizer):
        pending += ids
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


class RecoveryData(ABC):
    """What a recovery trains on: one subclass per `recovery.data` kind, chosen by name in `KINDS`
    or, for a kind from outside prunebench, by `recovery.data._target_` (its other keys are the
    constructor's own options). A kind says before any model loads whether its data is there and
    usable (`check`), names what it reads for the run key and the report (`data_ids`), and makes the
    token examples (`examples`); the held-out split, the batch count and the two shapes of example
    (instruction records, text windows) are shared here. `options`: the resolved `recovery` config;
    `task`: the task definition a kind with `reads_task` reads (`recovery.task`). A bad option is a
    ValueError naming it, raised by the constructor."""

    name = ""  # what messages call the kind: recovery.data=<name>
    reads_task = False  # recovery.task is instantiated and handed over

    def __init__(self, options: dict, data_dir: str | None = None, task=None):
        self.options, self.data_dir, self.task = options, data_dir, task
        self.dropped = 0  # examples `labelled` dropped for want of a token to learn

    @property
    def records(self) -> bool:
        """Each example one record (all used: `n_samples` reads only text), not windows of text."""
        return False

    @property
    def path(self) -> Path | None:
        return Path(self.options["path"]).expanduser() if self.options.get("path") else None

    @abstractmethod
    def check(self) -> None:
        """Before any model loads: ValueError or FileNotFoundError naming the value when the data is
        not there or not usable."""

    @abstractmethod
    def data_ids(self) -> set[str]:
        """What it reads: local paths (their digests enter the run key) and hub names."""

    @abstractmethod
    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        """The token examples {input_ids, labels}, IGNORED where no loss is taken."""

    def check_count(self, count: int, what: str) -> None:
        held, batch = self.options["val_samples"], self.options["batch_size"]
        if count - held < batch:
            raise ValueError(f"recovery.path={str(self.path)!r} has {what}: fewer than one batch "
                             f"(recovery.batch_size={batch}) besides the recovery.val_samples={held} held out; give "
                             f"more data, or lower recovery.batch_size / recovery.val_samples")

    def labelled(self, made: list[dict[str, list[int]]]) -> list[dict[str, list[int]]]:
        """The examples with a token to learn (a label after the first position); the others are
        counted in `dropped`, which `split` names when too few are left."""
        kept = [e for e in made if any(label != IGNORED for label in e["labels"][1:])]
        self.dropped = len(made) - len(kept)
        return kept

    def instruction_examples(self, tokenizer, rows: list[dict]) -> list[dict[str, list[int]]]:
        return self.labelled([self.instruction_example(tokenizer, row) for row in rows])

    def instruction_example(self, tokenizer, row: dict) -> dict[str, list[int]]:
        """LLM-Pruner's tokenisation: the whole text cut at seq_len, EOS appended where it fits; without
        `train_on_inputs`, the prompt's positions (as the prompt alone tokenises) get no label. An
        example whose prompt fills seq_len has no label left and is dropped by `labelled`."""
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

    def windows(self, tokenizer, corpus) -> list[dict[str, list[int]]]:
        """Consecutive windows of the text (each starting with the BOS evaluation gives a window), or
        `n_samples` at random starts drawn per seed, by calibration's own sampler."""
        options = self.options
        if options["n_samples"] and options.get("windows") == "disjoint":
            windows = disjoint_windows(corpus.documents(), tokenizer, options["n_samples"], options["seq_len"],
                                       options["seed"])
        elif options["n_samples"]:
            windows = Calibration(corpus, f"recovery {self.name}", options["n_samples"], options["seq_len"],
                                  options["seed"]).samples(tokenizer).tolist()
        else:
            windows = streamed_windows(corpus, tokenizer, options["seq_len"])
        return [{"input_ids": w, "labels": w} for w in windows]

    def split(self, examples: list) -> tuple[list, list]:
        """(train, validation): `val_samples` held out at random per seed, as LLM-Pruner's
        train_test_split holds out its validation set. ValueError when the rest is under one batch."""
        held, batch = self.options["val_samples"], self.options["batch_size"]
        if len(examples) - held < batch:
            why = (f"; {self.dropped} record(s) were dropped because their prompt fills recovery.seq_len="
                   f"{self.options['seq_len']} tokens, leaving no response token to learn (the prompt's labels are "
                   f"ignored): raise recovery.seq_len, or set recovery.train_on_inputs=true" if self.dropped else "")
            raise ValueError(f"recovery data {sorted(self.data_ids())}: {len(examples)} examples of "
                             f"recovery.seq_len={self.options['seq_len']} tokens leave fewer than one batch "
                             f"(recovery.batch_size={batch}) besides the recovery.val_samples={held} held out{why}")
        order = list(range(len(examples)))
        random.Random(self.options["seed"]).shuffle(order)
        return [examples[i] for i in order[held:]], [examples[i] for i in order[:held]]


class AlpacaData(RecoveryData):
    """The hub's alpaca-cleaned instruction records (LLM-Pruner's recovery data)."""

    name = "alpaca"

    @property
    def records(self) -> bool:
        return True

    def data_ids(self) -> set[str]:
        return {f"hf:{ALPACA_HUB}"}

    def check(self) -> None:
        """One request to the hub decides; unreached, the refusal names the local file that serves
        instead (the generic text names data_dir, which alpaca never reads)."""
        try:
            Alpaca().check()
        except HubUnreachable as err:
            reason = str(err).partition(" was not reached by one request ")[2] or "no answer"
            offline = "HF_HUB_OFFLINE=1 while no cache holds it" in str(err)
            raise HubUnreachable(f"recovery.data=alpaca reads the hub dataset {ALPACA_HUB!r}, and " + (
                                 "HF_HUB_OFFLINE=1 while no cache holds it" if offline else
                                 f"the hub was not reached by one request {reason.split('; without network')[0]}") +
                                 "; without network "
                                 "give its records as a file: recovery.data=file recovery.path=FILE (e.g. "
                                 "alpaca_data_cleaned.json: a JSON list of {instruction, input, output})") from None

    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        return self.instruction_examples(tokenizer, load_rows(ALPACA_HUB))


class FileData(RecoveryData):
    """`recovery.path`: instruction records in a .json/.jsonl (.gz too) file, any other file as text."""

    name = "file"

    def __init__(self, options: dict, data_dir: str | None = None, task=None):
        super().__init__(options, data_dir, task)
        if not options.get("path"):
            raise ValueError("recovery.data=file needs recovery.path=FILE (JSON/JSONL alpaca records, or plain text)")

    @property
    def records(self) -> bool:
        return is_json(self.path)

    def corpus(self) -> TextFile:
        return TextFile(str(self.path), option="recovery.path", use="recovery windows")

    def data_ids(self) -> set[str]:
        return {data_id(str(self.path))}

    def check(self) -> None:
        """The file is there, not empty, has the alpaca schema where it is records, and holds one
        batch besides the held-out examples. Text is counted here at one byte a token at most (its
        tokens are not known before the tokenizer loads); `split` counts them again once they are."""
        path = self.path
        if not path.is_file():
            raise FileNotFoundError(f"recovery.path={str(path)!r} does not exist; give a JSON/JSONL file of alpaca "
                                    f"records {{instruction, input, output}}, or a plain-text file")
        if not self.records:
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

    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        if not self.records:
            return self.windows(tokenizer, self.corpus())
        rows = read_records(self.path.resolve())
        check_records(rows, str(self.path))
        return self.instruction_examples(tokenizer, rows)


class TextData(RecoveryData):
    """Windows of a corpus that checks itself (`corpora.py`)."""

    @abstractmethod
    def corpus(self):
        """The corpus (`corpora.TextCorpus`) the windows are cut from."""

    def check(self) -> None:
        self.corpus().check()

    def data_ids(self) -> set[str]:
        return self.corpus().data_ids()

    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        return self.windows(tokenizer, self.corpus())


class WikiText2Data(TextData):
    """WikiText-2's train split: data_dir/wikitext2, else the hub (SliceGPT's recovery data)."""

    name = "wikitext2"

    def corpus(self) -> WikiText2:
        return WikiText2("train", self.data_dir)


class TaskData(TextData):
    """A task definition's documents (context and gold answer), `recovery.task`."""

    name = "task"
    reads_task = True

    def __init__(self, options: dict, data_dir: str | None = None, task=None):
        super().__init__(options, data_dir, task)
        if task is None:
            raise ValueError("recovery.data=task needs a task definition: +task@recovery.task=NAME "
                             "recovery.task.tasks.NAME.source.path=TRAIN_FILE (a split that is not evaluated)")

    def corpus(self) -> TaskText:
        return TaskText(self.task)


# recovery.data=<name>: the kinds prunebench ships; a kind from elsewhere is named by its _target_
KINDS: dict[str, type[RecoveryData]] = {kind.name: kind for kind in (AlpacaData, FileData, WikiText2Data, TaskData)}


def data_kind(data) -> tuple[type[RecoveryData], dict]:
    """(the class, its own options) that `recovery.data` names: a name in `KINDS`, or a mapping
    whose `_target_` is a RecoveryData subclass and whose other keys are that class's options."""
    if not isinstance(data, dict):
        if data not in KINDS:
            raise ValueError(f"recovery.data={data!r}; valid: {list(KINDS)}, or a class of your own: "
                             f"recovery.data={{_target_: your.module.YourData}} (a RecoveryData subclass)")
        return KINDS[data], {}
    own = dict(data)
    target = own.pop("_target_", None)
    if not isinstance(target, str):
        raise ValueError(f"recovery.data={data!r} has no _target_ naming its class; give a name of {list(KINDS)}, "
                         f"or {{_target_: your.module.YourData}} (a RecoveryData subclass)")
    module, _, attribute = target.rpartition(".")
    try:
        kind = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as err:  # ValueError: a target without a module
        raise ValueError(f"recovery.data._target_={target!r} cannot be imported ({type(err).__name__}: {err}); is "
                         f"its package installed, or on PYTHONPATH?") from None
    if not (isinstance(kind, type) and issubclass(kind, RecoveryData)):
        raise ValueError(f"recovery.data._target_={target!r} is not a prunebench.recovery.data.RecoveryData "
                         f"subclass: a recovery data kind subclasses it (docs/architecture.md)")
    return kind, own


def recovery_data(cfg: DictConfig, deferred: list[str] | None = None) -> RecoveryData:
    """The recovery's data, its options checked (not the data itself: `check_recovery`)."""
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    try:
        kind, own = data_kind(options["data"])
        task = None
        if kind.reads_task and cfg.recovery.get("task") is not None:
            recovery = copy.deepcopy(cfg.recovery)  # still under the root config, so `${data_dir}` resolves
            with open_dict(recovery):
                recovery.task = chosen_definition(recovery.task, "recovery.task")
            with deferring(deferred):
                task = instantiate(recovery.task, _convert_="all")
        try:
            return kind(options, cfg.get("data_dir"), task, **own)
        except TypeError as err:  # an option the class does not take
            raise ValueError(f"recovery.data={options['data']!r}: {err}") from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
