"""The machine's matmul rate: what a plan times a job's evaluation by where its store has no run of
the model to take a speed from (plan.py). A short torch.matmul probe, a fraction of a second, in the
job's dtype on the job's device; a forward never reaches the matmul peak (attention, norms, memory
traffic), so a time from this rate is a lower bound."""

from __future__ import annotations

import time

import torch

# the sides of the probe's square matrices: large enough to reach the rate a model's matmuls see,
# small enough that a CPU without native bf16 still answers in a fraction of a second
SIDES = {"cpu": 1024, "cuda": 8192}


def present(device: str) -> bool:
    """Whether `device` (model.device: cpu, cuda, cuda:N) is on this machine."""
    kind = torch.device(device)
    if kind.type == "cpu":
        return True
    if kind.type == "cuda":
        return torch.cuda.is_available() and (kind.index or 0) < torch.cuda.device_count()
    return False


def matmul_rate(dtype: torch.dtype, device: str, repeats: int = 3) -> float:
    """FLOP/s of the fastest of `repeats` square matmuls, after one that warms the kernels up."""
    side = SIDES[torch.device(device).type]
    a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
    timed(a, b, device)
    return 2 * side**3 / min(timed(a, b, device) for _ in range(repeats))


def timed(a: torch.Tensor, b: torch.Tensor, device: str) -> float:
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    torch.matmul(a, b)
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
