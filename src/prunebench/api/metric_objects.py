"""Metrics as lm-eval reports them, kept in torchmetrics objects: the tables tasks choose from and
the standard errors logged beside each metric."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torchmetrics

from prunebench.api.metrics import BOOTSTRAP_ITERS, mean_stderr


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
CLASS_METRICS: dict[str, tuple[Callable[[int], torchmetrics.Metric], bool]] = {
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
        metric.reset()  # update and compute: forward would also keep and merge back an accumulated state
        metric.update(preds[index], target[index])
        values.append(float(metric.compute()))
    return float(torch.tensor(values).nan_to_num().std())


def update_from_records(metrics, records: list[dict]) -> None:
    """A MeanMetric averages each record's value under its name (a per-document metric: acc,
    exact_match); any other metric is corpus-level and sees the records' `pred` and `gold` as
    classes (MCC, F1)."""
    for name, metric in metrics.items():
        if isinstance(metric, torchmetrics.MeanMetric):
            for record in records:
                metric.update(record[name])
        else:
            metric.update(*(torch.tensor([r[key] for r in records], device=metric.device) for key in ("pred", "gold")))


def records_stderr(metric: torchmetrics.Metric, name: str, records: list[dict]) -> float:
    """The standard error `update_from_records`' metrics are logged with: lm-eval's mean_stderr for a
    per-document metric, bootstrap for a corpus-level one."""
    if isinstance(metric, torchmetrics.MeanMetric):
        return mean_stderr([r[name] for r in records])
    return bootstrap_stderr(metric, *(torch.tensor([r[key] for r in records]) for key in ("pred", "gold")))
