"""Scores documents in Trainer.test and keeps lm-eval's metrics in torchmetrics objects."""

from __future__ import annotations

import math

import lightning as L
import torch
import torchmetrics

from prunebench.evaluation.datamodule import EncodedDoc
from prunebench.evaluation.loglik import score_documents


def first_argmax(values: list[float]) -> int:
    """numpy's argmax rule: the first index wins ties."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


class MultipleChoiceModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task_name: str, metrics: list[str]):
        super().__init__()
        self.model = model
        self.task_name = task_name
        self.metric_names = list(metrics)
        self.metrics = torch.nn.ModuleDict({m: torchmetrics.MeanMetric() for m in self.metric_names})
        self.records: list[dict] = []

    def test_step(self, batch: list[EncodedDoc], batch_idx: int) -> None:
        for doc, scored in zip(batch, score_documents(self.model, batch)):
            lls = [s for s, _ in scored]
            greedy = [g for _, g in scored]
            inst = doc.instance
            pred = first_argmax(lls)
            pred_norm = first_argmax([ll / n if n else ll for ll, n in zip(lls, inst.choice_lengths)])
            values = {"acc": float(pred == inst.gold), "acc_norm": float(pred_norm == inst.gold)}
            for name in self.metric_names:
                self.metrics[name].update(values[name])
            self.records.append({"doc_id": inst.doc_id, "gold": inst.gold, "pred": pred, "pred_norm": pred_norm,
                                 "loglikelihoods": lls, "is_greedy": greedy, "context": inst.contexts[0],
                                 "continuations": inst.continuations,
                                 **{name: values[name] for name in self.metric_names}})
        for name in self.metric_names:
            self.log(f"{self.task_name}/{name}", self.metrics[name], on_step=False, on_epoch=True,
                     batch_size=len(batch))

    def stderr(self, name: str) -> float:
        """lm-eval's mean_stderr: sample standard deviation (n - 1) over sqrt(n)."""
        values = [r[name] for r in self.records]
        n = len(values)
        if n < 2:
            return float("nan")
        mean = sum(values) / n
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
