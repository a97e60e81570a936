"""Classification tasks scored from a classifier's own logits (GLUE with fine-tuned encoders; image
classification in tasks/vision.py), as opposed to multiple choice scored by an LM's loglikelihoods."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

import torch

from prunebench.api.metric_objects import CLASS_METRICS, REGRESSION_METRICS
from prunebench.api.requests import CLASSIFY
from prunebench.tasks.sources import DocSource


class ClassificationTask:
    """Examples are (input, label) pairs; `collate(loaded)` turns a list of them into a batch of
    model inputs with `labels`, the same for evaluation and for labelled calibration (HIS)."""

    kind: ClassVar[str] = CLASSIFY
    lower_is_better: ClassVar[bool] = False
    families: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, source, metrics: Sequence[str], primary: str, batch_size: int = 32):
        self.name, self.source, self.metrics, self.primary = name, source, list(metrics), primary
        self.batch_size = batch_size
        valid = REGRESSION_METRICS if self.regression else CLASS_METRICS
        bad = [m for m in self.metrics if m not in valid]
        if bad:
            raise ValueError(f"task {name}: unknown metric(s) {bad}; valid: {sorted(valid)}")
        if primary not in self.metrics:
            raise ValueError(f"task {name}: primary={primary!r} must be one of metrics {self.metrics}")

    regression = False

    def check(self) -> None:
        self.source.check()

    def data_ids(self) -> set[str]:
        from prunebench.corpora import data_id

        return {data_id(self.source.describe())}

    @property
    def num_labels(self) -> int:
        raise NotImplementedError

    def examples(self, limit: int | None = None) -> Sequence:
        raise NotImplementedError

    def check_model(self, loaded) -> None:
        if loaded.family not in self.families:
            raise ValueError(f"task {self.name} scores a classifier's logits; model {loaded.name!r} is "
                             f"family {loaded.family!r} (valid: {sorted(self.families)})")

    def collate(self, loaded):
        raise NotImplementedError

    def labelled_batches(self, loaded, n_samples: int, seed: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
        """`n_samples` examples drawn by `seed`, as model-input batches with labels (HIS's task loss)."""
        self.check_model(loaded)
        examples = self.examples()
        picked = random.Random(seed).sample(range(len(examples)), min(n_samples, len(examples)))
        collate = self.collate(loaded)
        batches = [collate([examples[i] for i in picked[s:s + batch_size]]) for s in range(0, len(picked), batch_size)]
        return [{k: v.to(loaded.device) for k, v in b.items()} for b in batches]


class TextClassificationTask(ClassificationTask):
    """One or two text fields per document (`text_fields`, a sentence pair is tokenised as a pair);
    `labels` are the class names in label-index order, empty for a regression task (STS-B)."""

    families = frozenset({"encoder"})

    def __init__(self, name: str, source: DocSource, text_fields: Sequence[str], labels: Sequence[str],
                 metrics: Sequence[str], primary: str, label_field: str = "label", batch_size: int = 32):
        self.text_fields, self.labels, self.label_field = list(text_fields), list(labels), label_field
        if not 1 <= len(self.text_fields) <= 2:
            raise ValueError(f"task {name}: text_fields={self.text_fields} must name one field or a pair")
        super().__init__(name, source, metrics, primary, batch_size)

    @property
    def regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return max(len(self.labels), 1)

    def examples(self, limit: int | None = None) -> list[tuple[tuple[str, ...], float | int]]:
        docs = self.source.load()
        docs = docs[:limit] if limit else docs
        return [(tuple(str(d[f]) for f in self.text_fields), d[self.label_field]) for d in docs]

    def check_model(self, loaded) -> None:
        """A checkpoint's logits are in its config's id2label order; generic names (LABEL_0...) say
        nothing about the order, so only their number is checked."""
        super().check_model(loaded)
        config = loaded.model.config
        theirs = [str(config.id2label[i]) for i in range(config.num_labels)]
        if len(theirs) != self.num_labels:
            raise ValueError(f"task {self.name} has {self.num_labels} label(s) {self.labels or ['(regression)']}, "
                             f"but model {loaded.name!r} outputs {len(theirs)}: {theirs}")
        if self.regression or all(t.upper() == f"LABEL_{i}" for i, t in enumerate(theirs)):
            return
        norm = lambda names: [n.lower().replace("-", "_").replace(" ", "_") for n in names]  # noqa: E731
        if norm(theirs) != norm(self.labels):
            raise ValueError(f"model {loaded.name!r} orders its labels {theirs} (config.id2label) but task "
                             f"{self.name} expects {self.labels}; use a checkpoint trained on this task's "
                             f"label order, or set task.tasks.{self.name}.labels to the model's order if the "
                             f"names only differ")

    def collate(self, loaded):
        tokenizer, max_length = loaded.tokenizer, loaded.max_length
        dtype = torch.float if self.regression else torch.long

        def batch(examples):
            texts = list(zip(*(t for t, _ in examples)))
            enc = tokenizer(*texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            return {**enc, "labels": torch.tensor([label for _, label in examples], dtype=dtype)}

        return batch
