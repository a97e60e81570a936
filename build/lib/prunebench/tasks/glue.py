"""GLUE's validation (and train) splits, from the hub (`nyu-mll/glue`) or from the tsv files of the
original release (`glue_data/<TASK>/dev.tsv` ...). Each tsv layout is read into the hub's schema
(field names, label indices in the hub's label order) so one task definition serves both copies."""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from prunebench.tasks.sources import BenchmarkSource


@dataclass(frozen=True)
class TsvLayout:
    folder: str
    header: bool
    columns: dict[str, str | int]  # hub field -> tsv column (name, or index when there is no header)
    labels: tuple[str, ...] = ()  # tsv label strings in the hub's index order; () = numeric labels


LAYOUTS = {
    "sst2": TsvLayout("SST-2", True, {"sentence": "sentence", "label": "label"}),
    "cola": TsvLayout("CoLA", False, {"sentence": 3, "label": 1}),
    "mrpc": TsvLayout("MRPC", True, {"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"}),
    "qqp": TsvLayout("QQP", True, {"question1": "question1", "question2": "question2", "label": "is_duplicate"}),
    "stsb": TsvLayout("STS-B", True, {"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}),
    "qnli": TsvLayout("QNLI", True, {"question": "question", "sentence": "sentence", "label": "label"},
                      ("entailment", "not_entailment")),
    "mnli": TsvLayout("MNLI", True, {"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"},
                      ("entailment", "neutral", "contradiction")),
    "rte": TsvLayout("RTE", True, {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
                     ("entailment", "not_entailment")),
}
# hub split -> the release's file name
TSV_FILES = {"train": "train.tsv", "validation": "dev.tsv", "validation_matched": "dev_matched.tsv",
             "validation_mismatched": "dev_mismatched.tsv"}


def read_tsv(task: str, path: Path) -> list[dict]:
    """GLUE's own processors read with quoting off: the text holds unbalanced quotes."""
    layout = LAYOUTS[task]
    csv.field_size_limit(sys.maxsize)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    if layout.header:
        names, rows = rows[0], rows[1:]
        missing = [c for c in layout.columns.values() if c not in names]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing} in the header {names}; is it GLUE {task}'s tsv?")
        index = {field: names.index(col) for field, col in layout.columns.items()}
    else:
        index = dict(layout.columns)
    docs = []
    for i, row in enumerate(rows):
        doc = {field: row[col] for field, col in index.items()}
        raw = doc["label"]
        if layout.labels:
            doc["label"] = layout.labels.index(raw)
        else:
            doc["label"] = float(raw) if task == "stsb" else int(raw)
        docs.append({**doc, "idx": i})
    return docs


class GlueSource(BenchmarkSource):
    """One GLUE task's split: `path` (a tsv in the release layout, or a hub-schema file or dataset
    folder), else `<data_dir>/glue/<TASK>/<file>.tsv`, else the hub's `nyu-mll/glue`."""

    def __init__(self, task: str, split: str = "validation", path: str | None = None, data_dir: str | None = None,
                 hub: str = "nyu-mll/glue"):
        if task not in LAYOUTS:
            raise ValueError(f"GLUE task {task!r} is not one of {sorted(LAYOUTS)}")
        if split not in TSV_FILES:
            raise ValueError(f"GLUE split {split!r} is not one of {sorted(TSV_FILES)}")
        self.task = task
        super().__init__(hub=hub, split=split, name=task, file=f"glue/{LAYOUTS[task].folder}/{TSV_FILES[split]}",
                         data_dir=data_dir, path=path)

    def load(self) -> list[dict]:
        where = self.location()
        if self._docs is None and where is not None and where.suffix == ".tsv":
            self._docs = read_tsv(self.task, where)
        return super().load()
