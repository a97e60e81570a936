"""lm-eval's TaskManager with its built-in tasks' index read from the prunebench cache.

`TaskManager()` indexes lm-eval's built-in tasks by reading some 14 000 YAML files, in every process
that names an lm-eval task: each job of a sweep, each plan. lm-eval keeps nothing between processes,
so the built-in folder's index is kept here, keyed by lm-eval's version, the folder and every file's
size and mtime in it, and read back in a fraction of that time.
JSON, never pickle (the cache may be shared); a config JSON cannot carry unchanged (a date, a
number as a key) is kept as its path and read again from its YAML, as lm-eval reads it. A user's
`include_path` folders are indexed by lm-eval each time: they change while one writes them."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import defaultdict
from pathlib import Path

from prunebench.cache import cache_dir, content_key

log = logging.getLogger(__name__)


def task_manager(include_path: list[str]):
    """lm-eval's TaskManager over its built-in tasks and `include_path`, as `TaskManager(include_path=...)`
    builds it: the include_path folders come after the built-ins and override a task of the same name."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    manager = TaskManager(include_path=include_path or None, include_defaults=False)
    own = manager._index
    for name in own.keys() & (index := built_in_index()).keys():
        log.warning("Task '%s' from %s overrides existing task from %s", name, own[name].yaml_path, index[name].yaml_path)
    index.update(own)
    # TaskManager.__init__'s name lists, over the joined index
    kinds = defaultdict(list)
    for name, entry in index.items():
        kinds[entry.kind].append(name)
    manager._index = index
    manager._all_tasks = sorted(index)
    manager._all_subtasks = sorted(kinds[Kind.TASK] + kinds[Kind.PY_TASK])
    manager._all_groups = sorted(kinds[Kind.GROUP])
    manager._all_tags = sorted(kinds[Kind.TAG])
    return manager


def built_in_index() -> dict:
    """lm-eval's index of its own task folder."""
    import lm_eval

    return cached_index(Path(lm_eval.__file__).parent / "tasks", lm_eval.__version__)


def cached_index(root: Path, version: str) -> dict:
    """lm-eval's TaskIndex of `root`: from the cache, or built and then kept there."""
    from lm_eval.tasks._index import TaskIndex

    path = cache_dir("lm_eval_index") / f"{content_key([version, str(root), folder_digest(root)])}.json"
    if path.exists():
        try:
            return read_index(path)
        except (ValueError, KeyError, TypeError) as err:  # cut short or not ours: built again below
            log.warning("lm-eval's cached task index %s is unreadable (%s); building it again", path, err)
    index = TaskIndex.build([root])
    write_index(index, path)
    return index


def folder_digest(root: Path) -> str:
    """Every file's path, size and mtime under `root` (an include need not end in .yaml): 0.2 s.
    Not `__pycache__`: loading a task's `!function` writes there, and the index reads no Python."""
    listed = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]  # pruned as the walk goes
        listed += [os.path.join(os.path.relpath(folder, root), name) for name in files]
    digest = hashlib.sha256()
    for name in sorted(listed):
        stat = os.stat(os.path.join(root, name))
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def carried(cfg) -> bool:
    """Whether JSON gives `cfg` back equal, as lm-eval's loader made it."""
    try:
        return json.loads(json.dumps(cfg, allow_nan=False)) == cfg
    except (TypeError, ValueError):
        return False


def write_index(index: dict, path: Path) -> None:
    """Atomically (a sweep's jobs may build it at once); a cache that cannot be written costs the next
    process the build again, nothing more."""
    rows = {}
    for name, e in index.items():
        kept = carried(e.cfg)
        rows[name] = {"kind": e.kind.name, "yaml_path": None if e.yaml_path is None else str(e.yaml_path),
                      "tags": sorted(e.tags), "cfg": e.cfg if kept else None, "reread": not kept}
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(json.dumps(rows))
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        log.warning("lm-eval's task index was not cached at %s: %s", path, err)


def read_index(path: Path) -> dict:
    from lm_eval.tasks._index import Entry, Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    index = {}
    for name, row in json.loads(path.read_text()).items():
        yaml_path = None if row["yaml_path"] is None else Path(row["yaml_path"])
        cfg = load_yaml(yaml_path, resolve_func=False, recursive=True) if row["reread"] else row["cfg"]
        index[name] = Entry(name=name, kind=Kind[row["kind"]], yaml_path=yaml_path, cfg=cfg, tags=set(row["tags"]))
    return index
