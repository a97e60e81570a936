"""PIQA's release format: `valid.jsonl` (goal, sol1, sol2) with its labels in a separate
`valid-labels.lst` (one 0/1 per line, aligned). The hub's copy carries `label` in each document."""

from __future__ import annotations

from pathlib import Path

from prunebench.tasks.sources import read_records


def labels_file(path: Path) -> Path:
    """The release names the labels after the documents: train.jsonl -> train-labels.lst."""
    return path.with_name(path.name.split(".")[0] + "-labels.lst")


def companion_files(path: Path) -> list[Path]:
    """What `read` reads besides `path` (sources.BenchmarkSource.data_ids: part of the run's inputs)."""
    labels = labels_file(path)
    return [labels] if labels.is_file() else []


def read(path: Path) -> list[dict]:
    docs = read_records(path)
    if not docs or "label" in docs[0]:
        return docs
    labels_path = labels_file(path)
    if not labels_path.is_file():
        raise FileNotFoundError(f"{str(path)!r} has no labels and {str(labels_path)!r} does not exist "
                                f"(PIQA's release keeps them in <split>-labels.lst beside the documents)")
    labels = [int(line) for line in labels_path.read_text(encoding="utf-8").split()]
    if len(labels) != len(docs):
        raise ValueError(f"{labels_path} has {len(labels)} labels for {len(docs)} documents in {path}")
    return [{**doc, "label": label} for doc, label in zip(docs, labels)]
