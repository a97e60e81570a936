"""Classifiers scored from their logits in Trainer.test: torchmetrics accumulate over the whole
split (MCC, F1 and correlations are corpus-level, not means of per-example scores)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import lightning as L
import torch
import torchmetrics
from torch.utils.data import DataLoader

from prunebench.pruners.structured import model_outputs


class MatthewsCorrCoef(torchmetrics.classification.MulticlassMatthewsCorrCoef):
    """sklearn's matthews_corrcoef (what lm-eval and GLUE report): 0 whenever the predictions or the
    labels are all one class. torchmetrics' two-class reduction returns +-1 or an epsilon-smoothed
    ratio there instead (a constant "yes" on a CoLA-like split scores 0.36, not 0), which would credit
    exactly the collapsed models that heavy pruning produces."""

    def compute(self) -> torch.Tensor:
        confmat = self.confmat.double()
        true, pred = confmat.sum(1), confmat.sum(0)
        correct, total = confmat.trace(), confmat.sum()
        denom = (total**2 - pred @ pred) * (total**2 - true @ true)
        if denom <= 0:
            return torch.zeros((), device=confmat.device)
        return ((correct * total - true @ pred) / denom.sqrt()).float()


# name -> (torchmetrics factory given the number of classes, whether it takes logits (else class ids))
METRICS: dict[str, tuple[Callable[[int], torchmetrics.Metric], bool]] = {
    "acc": (lambda n: torchmetrics.classification.MulticlassAccuracy(n, average="micro"), True),
    "top1": (lambda n: torchmetrics.classification.MulticlassAccuracy(n, top_k=1, average="micro"), True),
    "top5": (lambda n: torchmetrics.classification.MulticlassAccuracy(n, top_k=min(5, n), average="micro"), True),
    "mcc": (lambda n: MatthewsCorrCoef(n), False),
    "f1": (lambda n: torchmetrics.classification.BinaryF1Score(), False),  # positive class 1, as sklearn/lm-eval
}
REGRESSION_METRICS: dict[str, tuple[Callable[[int], torchmetrics.Metric], bool]] = {
    "pearson": (lambda n: torchmetrics.PearsonCorrCoef(), True),
    "spearman": (lambda n: torchmetrics.SpearmanCorrCoef(), True),
}
PER_EXAMPLE = {"acc": 1, "top1": 1, "top5": 5}  # means of per-example hits: analytic stderr
BOOTSTRAP_ITERS = 1000


class ClassificationDataModule(L.LightningDataModule):
    def __init__(self, examples: Sequence, collate: Callable, batch_size: int):
        super().__init__()
        self.examples, self.collate, self.batch_size = examples, collate, batch_size

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.examples, batch_size=self.batch_size, collate_fn=self.collate)


class ClassificationModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task_name: str, metrics: list[str], num_labels: int):
        super().__init__()
        self.model, self.task_name, self.metric_names = model, task_name, list(metrics)
        self.regression = num_labels == 1
        table = REGRESSION_METRICS if self.regression else METRICS
        self.takes_logits = {m: table[m][1] for m in self.metric_names}
        self.metrics = torch.nn.ModuleDict({m: table[m][0](num_labels) for m in self.metric_names})
        self.records: list[dict] = []
        self.golds, self.outputs = [], []

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        labels = batch["labels"]
        out = model_outputs(self.model, {k: v for k, v in batch.items() if k != "labels"})
        logits = (out if isinstance(out, torch.Tensor) else out.logits).float()
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


def bootstrap_stderr(metric: torchmetrics.Metric, preds: torch.Tensor, target: torch.Tensor) -> float:
    """A corpus-level metric (MCC, F1, a correlation) has no per-example values to take a standard
    error of: lm-eval reports the standard deviation of the metric over bootstrap resamples of the
    examples, as here (fewer draws, and a fixed seed so a rerun logs the same number)."""
    n = len(target)
    if n < 2:
        return float("nan")
    metric = metric.clone().cpu()
    preds, target = preds.cpu(), target.cpu()
    generator = torch.Generator().manual_seed(1234)
    values = []
    for _ in range(BOOTSTRAP_ITERS):
        index = torch.randint(0, n, (n,), generator=generator)
        metric.reset()
        values.append(float(metric(preds[index], target[index])))
    return float(torch.tensor(values).nan_to_num().std())
