"""2:4 semi-structured sparse kernels (torch.sparse.to_sparse_semi_structured) for Linear weights
that already hold a 2:4 pattern. Only CUDA devices of compute capability >= 8.0 have the kernels."""

from __future__ import annotations

import torch

from prunebench.models.introspection import block_linears


def is_2_4(weight: torch.Tensor) -> bool:
    groups = weight.reshape(-1, 4)
    return bool(((groups != 0).sum(1) <= 2).all())


def supported(device: torch.device) -> str | None:
    """None when supported, else why not."""
    if device.type != "cuda":
        return f"no 2:4 sparse kernels on {device.type}"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "2:4 sparse kernels need compute capability >= 8.0"
    return None


def to_semi_structured(model: torch.nn.Module) -> int:
    """Swap every 2:4-patterned block Linear weight for its sparse form; returns how many."""
    from torch.sparse import to_sparse_semi_structured

    count = 0
    for linear in block_linears(model).values():
        if linear.weight.shape[1] % 64 == 0 and linear.weight.shape[0] % 32 == 0 and is_2_4(linear.weight):
            linear.weight = torch.nn.Parameter(to_sparse_semi_structured(linear.weight.detach()), requires_grad=False)
            count += 1
    return count
