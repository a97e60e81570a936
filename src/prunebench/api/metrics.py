"""Numbers as lm-eval reports them: its argmax rule, its standard error of a mean, and metrics
written as the shortest decimal of their float32. No torch here: validation and a skipped job read
these without importing torchmetrics (api.metric_objects holds the metric objects)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def first_argmax(values: Sequence[float]) -> int:
    """numpy's argmax rule: the first index wins ties."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def readable(value):
    """A metric computed in float32 (torchmetrics' default) reaches MLflow and the tables as its float64
    expansion (0.30000001192092896); written as the shortest decimal of the same float32 (0.3), it
    loses nothing. Any other value, a float64 one included, is kept as it is."""
    if not isinstance(value, float) or math.isnan(value) or float(np.float32(value)) != value:
        return value
    return float(str(np.float32(value)))


def mean_stderr(values: Sequence[float]) -> float:
    """lm-eval's mean_stderr: sample standard deviation (n - 1) over sqrt(n)."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


BOOTSTRAP_ITERS = 1000
