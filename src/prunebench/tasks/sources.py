"""Where a task's documents come from: local JSON/JSONL, HF datasets (hub id or local folder),
published benchmarks (hub or local files), and BIG-bench task JSON. Every source can `check()`
cheaply before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from prunebench.cache import cache_dir
from prunebench.tasks.template import import_callable


class DocSource:
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

    def __init__(self, path: str, field: str | None = None):
        self.path, self.field = path, field

    def check(self) -> None:
        _require_file(self.path, "task.source.path")

    def load(self) -> list[dict]:
        path = _require_file(self.path, "task.source.path")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
        if isinstance(data, dict):
            data = data[self.field or "examples"]
        return list(data)

    def describe(self) -> str:
        return str(self.path)


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
        return JsonSource(str(path)).load()
    import datasets

    return [dict(row) for row in datasets.load_dataset(builder, data_files=str(path), split="train")]


class BenchmarkSource(DocSource):
    """One split of a published benchmark, wherever the user keeps it: `path` (a local file, in the
    hub's schema or in the benchmark's release format, or a downloaded dataset folder), else `file`
    under `data_dir` (the root key that places every task at once), else the hub dataset lm-eval reads.

    `reader` turns a local file into documents in the hub's schema, so one task definition serves
    every copy. Local files are read in `check()`: they are small, and a malformed one then fails
    before any model loads."""

    def __init__(self, hub: str | None, split: str, name: str | None = None, file: str | None = None,
                 data_dir: str | None = None, path: str | None = None,
                 reader: str = "prunebench.tasks.sources.read_records"):
        self.hub, self.split, self.name, self.file = hub, split, name, file
        self.data_dir, self.path, self.reader = data_dir, path, reader
        self._docs: list[dict] | None = None

    def location(self) -> Path | None:
        """The local copy to read; None means the hub."""
        if self.path:
            return Path(self.path).expanduser()
        if self.data_dir and self.file:
            return Path(self.data_dir).expanduser() / self.file
        if not self.hub:
            raise FileNotFoundError("this task has no hub dataset: set data_dir=DIR (holding "
                                    f"{self.file}) or task.tasks.<task>.source.path=FILE")
        return None

    def check(self) -> None:
        where = self.location()
        if where is None:
            return
        if not where.exists():
            origin = f"data_dir={self.data_dir!r} + {self.file!r}" if not self.path else "source.path"
            raise FileNotFoundError(f"data file {str(where)!r} ({origin}) does not exist; read another "
                                    f"copy with task.tasks.<task>.source.path=FILE")
        self.load()

    def load(self) -> list[dict]:
        if self._docs is None:
            where = self.location()
            if where is None or where.is_dir():
                self._docs = HFSource(str(where or self.hub), self.split, self.name).load()
            else:
                self._docs = import_callable(self.reader)(where)
        return self._docs

    def describe(self) -> str:
        where = self.location()
        return str(where) if where is not None else f"hf:{self.hub}/{self.name or ''}:{self.split}"


BIGBENCH_SDIST = "bigbench==1.0.0"


class BigBenchSource(DocSource):
    """A BIG-bench multiple-choice task (`target_scores`), shaped like the `hails/bigbench` HF
    dataset that lm-eval's bigbench tasks read (inputs, multiple_choice_targets,
    multiple_choice_scores), so the same templates work for both.

    Without `path`, the task JSON is extracted once from PyPI's bigbench sdist (358 MB; BIG-bench
    is on no other offline channel) into the cache."""

    def __init__(self, task: str, path: str | None = None, subtask: str | None = None):
        self.task, self.path, self.subtask = task, path, subtask

    def check(self) -> None:
        if self.path:
            _require_file(self.path, "task.source.path")

    def task_json(self) -> Path:
        if self.path:
            return _require_file(self.path, "task.source.path")
        rel = f"{self.task}/{self.subtask}/task.json" if self.subtask else f"{self.task}/task.json"
        return extract_bigbench([rel])[0]

    def load(self) -> list[dict]:
        spec = json.loads(self.task_json().read_text(encoding="utf-8"))
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


def bigbench_sdist() -> Path:
    """The sdist is kept in the cache so each later task extraction skips the download."""
    folder = cache_dir("downloads")
    found = sorted(folder.glob("bigbench-1.0.0.tar.gz"))
    if not found:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, BIGBENCH_SDIST],
                           check=True)
            next(Path(tmp).glob("bigbench-*.tar.gz")).rename(folder / "bigbench-1.0.0.tar.gz")
    return folder / "bigbench-1.0.0.tar.gz"


def extract_bigbench(relpaths: list[str]) -> list[Path]:
    root = cache_dir("data", "bigbench")
    targets = [root / rel for rel in relpaths]
    wanted = {f"bigbench-1.0.0/bigbench/benchmark_tasks/{rel}": rel
              for rel, target in zip(relpaths, targets) if not target.exists()}
    if wanted:
        with tarfile.open(bigbench_sdist()) as tar:
            for member in tar:
                rel = wanted.pop(member.name, None)
                if rel is not None:
                    out = root / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tar.extractfile(member).read())
                if not wanted:
                    break
        if wanted:
            raise FileNotFoundError(f"not in the BIG-bench sdist: {sorted(wanted.values())}")
    return targets


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
        import easy_vqa

        questions, answers, image_ids = getattr(easy_vqa, f"get_{self.split}_questions")()
        paths = getattr(easy_vqa, f"get_{self.split}_image_paths")()
        return [{"question": q, "answer": a, "image": paths[i]} for q, a, i in zip(questions, answers, image_ids)]

    def describe(self) -> str:
        return f"easy_vqa:{self.split}"
