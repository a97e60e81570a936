"""Scores documents in Trainer.test and keeps lm-eval's metrics in torchmetrics objects."""

from __future__ import annotations

import math

import lightning as L
import torch
import torchmetrics

from prunebench.evaluation.classification import METRICS as CLASS_METRICS, bootstrap_stderr
from prunebench.evaluation.datamodule import EncodedDoc
from prunebench.evaluation.loglik import score_documents
from prunebench.tasks.multiple_choice import PER_DOC_METRICS


def first_argmax(values: list[float]) -> int:
    """numpy's argmax rule: the first index wins ties."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


class MultipleChoiceModule(L.LightningModule):
    """`acc` / `acc_norm` are means of per-document hits; `mcc` / `f1` (lm-eval's GLUE metrics) are
    computed over all documents at once, with the chosen index (argmax log-likelihood) as the
    predicted class and the gold index as the label, among `num_choices` classes."""

    def __init__(self, model: torch.nn.Module, task_name: str, metrics: list[str], num_choices: int):
        super().__init__()
        self.model = model
        self.task_name = task_name
        self.metric_names = list(metrics)
        self.per_doc = [m for m in self.metric_names if m in PER_DOC_METRICS]
        self.metrics = torch.nn.ModuleDict({
            m: torchmetrics.MeanMetric() if m in PER_DOC_METRICS else CLASS_METRICS[m][0](num_choices)
            for m in self.metric_names})
        self.records: list[dict] = []

    def test_step(self, batch: list[EncodedDoc], batch_idx: int) -> None:
        preds, golds = [], []
        for doc, scored in zip(batch, score_documents(self.model, batch)):
            lls = [s for s, _ in scored]
            greedy = [g for _, g in scored]
            inst = doc.instance
            pred = first_argmax(lls)
            pred_norm = first_argmax([ll / n if n else ll for ll, n in zip(lls, inst.choice_lengths)])
            values = {"acc": float(pred == inst.gold), "acc_norm": float(pred_norm == inst.gold)}
            for name in self.per_doc:
                self.metrics[name].update(values[name])
            preds.append(pred)
            golds.append(inst.gold)
            self.records.append({"doc_id": inst.doc_id, "gold": inst.gold, "pred": pred, "pred_norm": pred_norm,
                                 "loglikelihoods": lls, "is_greedy": greedy, "context": inst.contexts[0],
                                 "continuations": inst.continuations, **{name: values[name] for name in self.per_doc}})
        for name in self.metric_names:
            if name not in self.per_doc:
                device = self.metrics[name].device
                self.metrics[name].update(torch.tensor(preds, device=device), torch.tensor(golds, device=device))
            self.log(f"{self.task_name}/{name}", self.metrics[name], on_step=False, on_epoch=True,
                     batch_size=len(batch))

    def stderr(self, name: str) -> float:
        """Per-document metrics: lm-eval's mean_stderr, the sample standard deviation (n - 1) over
        sqrt(n). MCC and F1: bootstrap, as lm-eval."""
        if name not in self.per_doc:
            preds, golds = (torch.tensor([r[k] for r in self.records]) for k in ("pred", "gold"))
            return bootstrap_stderr(self.metrics[name], preds, golds)
        values = [r[name] for r in self.records]
        n = len(values)
        if n < 2:
            return float("nan")
        mean = sum(values) / n
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
