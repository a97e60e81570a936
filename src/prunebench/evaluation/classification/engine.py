"""The `classify` engine: classifiers scored from their logits in Trainer.test; torchmetrics
accumulate over the whole split (MCC, F1 and correlations are corpus-level, not means of
per-example scores).

A classify task streams its examples (`examples(limit)`: (input, label) pairs, images read as the
loader reaches them) and turns a list of them into model inputs with labels (`collate(model)`); the
metrics see whole batches of logits, so each record (gold, prediction) is written here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader

from prunebench.api.metric_objects import CLASS_METRICS, REGRESSION_METRICS, bootstrap_stderr
from prunebench.models.loaded import LoadedModel

PER_EXAMPLE = {"acc": 1, "top1": 1, "top5": 5}  # means of per-example hits: analytic stderr


class ClassificationDataModule(L.LightningDataModule):
    def __init__(self, examples: Sequence, collate: Callable, batch_size: int):
        super().__init__()
        self.examples, self.collate, self.batch_size = examples, collate, batch_size

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.examples, batch_size=self.batch_size, collate_fn=self.collate)


class ClassificationModule(L.LightningModule):
    def __init__(self, model: LoadedModel, task_name: str, metrics: list[str], num_labels: int):
        super().__init__()
        self.model, self.adapter, self.task_name, self.metric_names = model.model, model, task_name, list(metrics)
        self.regression = num_labels == 1
        table = REGRESSION_METRICS if self.regression else CLASS_METRICS
        self.takes_logits = {m: table[m][1] for m in self.metric_names}
        self.metrics = torch.nn.ModuleDict({m: table[m][0](num_labels) for m in self.metric_names})
        self.records: list[dict] = []
        self.golds, self.outputs = [], []

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        labels = batch["labels"]
        logits = self.adapter.logits({k: v for k, v in batch.items() if k != "labels"}).float()
        scores = logits[:, 0] if self.regression else logits
        preds = scores if self.regression else logits.argmax(-1)
        for name in self.metric_names:
            self.metrics[name].update(scores if self.takes_logits[name] else preds, labels)
            self.log(f"{self.task_name}/{name}", self.metrics[name], on_step=False, on_epoch=True,
                     batch_size=len(labels))
        self.golds.append(labels.detach().cpu())
        self.outputs.append(scores.detach().cpu())
        start = len(self.records)
        for i, (gold, pred) in enumerate(zip(labels.tolist(), preds.tolist())):
            self.records.append({"doc_id": start + i, "gold": gold, "pred": pred})

    def stderr(self, name: str) -> float:
        """Accuracies: lm-eval's mean_stderr over per-example hits; corpus-level metrics: bootstrap."""
        golds, outputs = torch.cat(self.golds), torch.cat(self.outputs)
        n = len(golds)
        if n < 2:
            return float("nan")
        if name in PER_EXAMPLE:
            hits = (outputs.topk(min(PER_EXAMPLE[name], outputs.shape[-1]), -1).indices == golds[:, None]).any(-1)
            p = hits.float().mean().item()
            return math.sqrt(p * (1 - p) * n / (n - 1) / n)
        return bootstrap_stderr(self.metrics[name], outputs if self.takes_logits[name] else outputs.argmax(-1), golds)



def evaluation(task, model: LoadedModel, limit: int | None, options) -> tuple[ClassificationDataModule,
                                                                               ClassificationModule]:
    task.check_model(model)
    data = ClassificationDataModule(task.examples(limit), task.collate(model), task.batch_size)
    return data, ClassificationModule(model, task.name, task.metrics, task.num_labels)
