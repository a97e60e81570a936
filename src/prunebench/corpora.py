"""Plain-text corpora, shared by calibration (random windows) and perplexity (consecutive windows).

A corpus is a list of documents and the separator that joins them, the way pruning papers' data
loaders build one token stream (`"\\n\\n".join(wikitext["text"])`). Each corpus also names the data
it reads (`data_ids`), so that calibrating on an evaluated split can be refused before any model
loads: a local copy and the hub split it mirrors share a name."""

from __future__ import annotations

from pathlib import Path

from prunebench.hub import require_dataset

WIKITEXT2_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
C4_SHARDS = {"train": "en/c4-train.00000-of-01024.json.gz", "validation": "en/c4-validation.00000-of-00008.json.gz"}
ALPACA_HUB = "yahma/alpaca-cleaned"
ALPACA_PROMPT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                 "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
ALPACA_PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further "
                       "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
                       "{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
# MoP's released calibration prompts (amp_criterion.py): (without input, with input)
MOP_PROMPTS = ("Instruction: {instruction}\nResponse:", "Instruction: {instruction}\nInput: {input}\nResponse:")
ALPACA_TEMPLATES = {"alpaca": (ALPACA_PROMPT, ALPACA_PROMPT_INPUT), "mop": MOP_PROMPTS}


def local_file(path: str | Path, what: str) -> Path:
    found = Path(path).expanduser()
    if not found.is_file():
        raise FileNotFoundError(f"{what}: data file {str(found)!r} does not exist")
    return found.resolve()


def data_id(described: str) -> str:
    """The same file named two ways (relative, with ~) must compare equal."""
    path = Path(described).expanduser()
    return str(path.resolve()) if path.exists() else described


def is_json(path: Path) -> bool:
    return any(s in (".json", ".jsonl") for s in path.suffixes)


def load_rows(path: str, name: str | None = None, split: str = "train", data_files=None) -> list[dict]:
    """Rows of a hub dataset, or of a local .json/.jsonl(.gz) file, through `datasets`."""
    import datasets

    if Path(path).expanduser().is_file():
        path, data_files, split = "json", str(Path(path).expanduser()), "train"
    return [dict(row) for row in datasets.load_dataset(path, name, split=split, data_files=data_files)]


class TextCorpus:
    separator = "\n\n"

    def check(self) -> None:
        """Raise FileNotFoundError naming the path if a local file is missing (cheap, no loading)."""

    def documents(self) -> list[str]:
        raise NotImplementedError

    def data_ids(self) -> set[str]:
        raise NotImplementedError

    def text(self) -> str:
        return self.separator.join(self.documents())

    def pieces(self):
        """The text in pieces whose tokens, one after another, are the whole text's: here one piece;
        a large file's reader gives many, so that no reader of it holds the whole text's tokens."""
        yield self.text()


def universal(text: str) -> str:
    """Line ends as `read_text` gives them (universal newlines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class TextFile(TextCorpus):
    """Any local text file (one document; CRLF read as LF), or .json/.jsonl(.gz) records whose
    `field` holds the text."""

    def __init__(self, path: str, field: str = "text", option: str = "calib.path", use: str = "calibration windows"):
        self.path, self.field, self.option, self.use = path, field, option, use

    def check(self) -> None:
        path = local_file(self.path, self.option)
        with open(path, "rb") as handle:  # the first 64 KiB say whether there is any text (a file may be GBs)
            empty = not handle.read(1 << 16).strip()
        if empty:
            raise ValueError(f"{self.option}={self.path!r} is empty: {self.use} are cut from its text; "
                             f"point it at a file with text (or .json/.jsonl records whose `{self.field}` holds it)")
        if not is_json(path):
            for _ in self.pieces():  # read in pieces: a file that is not UTF-8 fails here, naming where
                pass

    def documents(self) -> list[str]:
        path = local_file(self.path, self.option)
        if is_json(path):
            return [row[self.field] for row in load_rows(str(path))]
        return ["".join(self.pieces())]

    def pieces(self, size: int = 1 << 20):
        """A plain text file's text in pieces of about `size` characters, each cut before a line end or
        a space where one is near (so that the pieces' tokens are, but for a rare merge across a cut,
        those of the whole text; a text shorter than `size` is one piece), read `size`
        bytes at a time: memory stays that of a piece whatever the file's size, one line of 29 MB
        included. Bytes that are not UTF-8 name the file, the line, the byte and the option."""
        import codecs

        path = local_file(self.path, self.option)
        if is_json(path):  # records: their texts joined
            yield from super().pieces()
            return
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, lines, carry = 0, 0, ""
        with open(path, "rb") as handle:
            while True:
                data = handle.read(size)
                pending = decoder.getstate()[0]  # the bytes of a character cut by the last read
                try:
                    text = carry + decoder.decode(data, final=not data)
                except UnicodeDecodeError as err:  # err.start counts from the pending bytes
                    line = lines + err.object.count(b"\n", 0, err.start) + 1
                    raise ValueError(f"{self.option}={self.path!r}: {path}, line {line} (byte "
                                     f"{offset - len(pending) + err.start} of the file): not UTF-8 ({err.reason}: "
                                     f"{err.object[err.start:err.end]!r}); text must be UTF-8 (convert it, e.g. "
                                     f"iconv -f latin1 -t utf-8)") from None
                offset, lines = offset + len(data), lines + data.count(b"\n")
                if not data:
                    if text:
                        yield universal(text)
                    return
                # before a space or a line end: byte-level BPE joins a space to the word after it
                cut = max(text.rfind("\n", len(text) // 2), text.rfind(" ", len(text) // 2))
                if cut <= 0:  # none in its second half: anywhere, but a CR waits for the LF it may precede
                    cut = len(text) - 1 if text.endswith("\r") else len(text)
                elif text[cut - 1] == "\r":
                    cut -= 1
                yield universal(text[:cut])
                carry = text[cut:]

    def data_ids(self) -> set[str]:
        return {data_id(self.path)}


class WikiText2(TextCorpus):
    """WikiText-2 (raw): `data_dir/wikitext2/wiki.{train,valid,test}.raw` when `data_dir` is set, else
    the hub's `wikitext` / `wikitext-2-raw-v1` split joined with blank lines (the GPTQ convention)."""

    def __init__(self, split: str = "test", data_dir: str | None = None):
        if split not in WIKITEXT2_FILES:
            raise ValueError(f"wikitext2 split={split!r} is not one of {list(WIKITEXT2_FILES)}")
        self.split, self.data_dir = split, data_dir

    def local_path(self) -> Path | None:
        return Path(self.data_dir).expanduser() / "wikitext2" / WIKITEXT2_FILES[self.split] if self.data_dir else None

    def check(self) -> None:
        path = self.local_path()
        if path is not None and not path.is_file():
            present = sorted(p.name for p in path.parent.glob("wiki.*.raw")) if path.parent.is_dir() else []
            ways = (f"; for calibration calib.split=validation reads {WIKITEXT2_FILES['validation']}, for a "
                    f"recovery recovery.data=file recovery.path=FILE gives its text, or data_dir=null reads the hub's"
                    if self.split == "train" else "")
            raise FileNotFoundError(f"wikitext2 split {self.split!r}: {str(path)!r} does not exist under "
                                    f"data_dir={self.data_dir!r} (present: {present or 'none'}){ways}")
        if path is None:
            require_dataset("wikitext", f"wikitext2 split {self.split!r}")

    def documents(self) -> list[str]:
        self.check()
        path = self.local_path()
        if path is not None:
            return [path.read_text(encoding="utf-8")]
        return [row["text"] for row in load_rows("wikitext", "wikitext-2-raw-v1", self.split)]

    def data_ids(self) -> set[str]:
        path = self.local_path()
        return {f"wikitext-2-raw:{self.split}"} | ({data_id(str(path))} if path is not None else set())


class C4(TextCorpus):
    """C4 (en): a local .json(.gz) file, or the first hub shard of the split that SparseGPT and Wanda
    read; documents joined by a space, as their loaders join the validation documents."""

    separator = " "

    def __init__(self, split: str = "train", path: str | None = None, max_documents: int | None = None):
        if split not in C4_SHARDS:
            raise ValueError(f"c4 split={split!r} is not one of {list(C4_SHARDS)}")
        self.split, self.path, self.max_documents = split, path, max_documents

    def check(self) -> None:
        if self.path:
            local_file(self.path, "c4 path")
        else:
            require_dataset("allenai/c4", f"c4 split {self.split!r}")

    def documents(self) -> list[str]:
        if self.path:
            rows = load_rows(str(local_file(self.path, "c4 path")))
        else:
            rows = load_rows("allenai/c4", split="train", data_files=C4_SHARDS[self.split])
        return [row["text"] for row in rows[:self.max_documents]]

    def data_ids(self) -> set[str]:
        return {data_id(self.path) if self.path else f"c4:{C4_SHARDS[self.split]}"}


class Alpaca(TextCorpus):
    """Instruction prompts (without the response) from alpaca-cleaned: a local JSON file of
    {instruction, input, output} records, or the hub dataset; `template` alpaca (Stanford Alpaca's)
    or mop (the MoP code's shorter one)."""

    def __init__(self, path: str | None = None, template: str = "alpaca"):
        if template not in ALPACA_TEMPLATES:
            raise ValueError(f"alpaca template={template!r}; valid: {sorted(ALPACA_TEMPLATES)}")
        self.path, self.template = path, ALPACA_TEMPLATES[template]

    def check(self) -> None:
        if self.path:
            local_file(self.path, "alpaca path")
        else:
            require_dataset(ALPACA_HUB, "alpaca")

    def documents(self) -> list[str]:
        rows = load_rows(str(local_file(self.path, "alpaca path")) if self.path else ALPACA_HUB)
        return [self.template[bool(row.get("input"))].format(**row) for row in rows]

    def data_ids(self) -> set[str]:
        return {data_id(self.path) if self.path else f"hf:{ALPACA_HUB}"}


def task_data_ids(task) -> set[str]:
    """What an evaluation task reads: its corpus's names, or its document source's description."""
    if hasattr(task, "data_ids"):
        return task.data_ids()
    source = getattr(task, "source", None)
    if source is None:  # a task that makes its documents itself reads no data
        return set()
    if hasattr(source, "data_ids"):
        return {data_id(i) for i in source.data_ids()}
    return {data_id(source.describe())}


class TaskText(TextCorpus):
    """A task's documents as the text the model reads: each context followed by its gold answer."""

    def __init__(self, task):
        self.task = task

    def check(self) -> None:
        self.task.check()

    def documents(self) -> list[str]:
        out = []
        for inst in self.task.instances():
            gold = inst.gold if 0 <= inst.gold < len(inst.contexts) else 0
            out.append(inst.contexts[gold] + inst.continuations[gold])
        return out

    def data_ids(self) -> set[str]:
        return task_data_ids(self.task)
