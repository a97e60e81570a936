"""Which weights to remove, given importance scores: `True` = pruned.

Unstructured masks follow one of two rules (`pruner.mask_rule`), both taking k = floor(n x sparsity)
of a comparison group of n scores (a layer, all layers, or one SparseGPT column block):
- `released` (default): every score at or below the (k+1)-th smallest, `s <= sort(s)[k]`, the line
  of Wanda's `prune_magnitude` and of SparseGPT's `mask1 = tmp <= thresh`. It removes k + 1 weights
  (more when scores tie at the threshold), so a user's numbers are the released code's numbers.
- `exact`: exactly k, ties broken by position (first in memory order goes first), so equal scores,
  common in quantised checkpoints, still give exact, reproducible sparsity.
Per-row and N:M masks remove an exact count under both rules, as Wanda's released code does."""

from __future__ import annotations

import torch

MASK_RULES = ("released", "exact")


def parse_pattern(pattern: str | None) -> tuple[int, int] | None:
    """'N:M' = at most N nonzero weights in every M consecutive inputs of a row (2:4 keeps half)."""
    if pattern is None:
        return None
    try:
        n, m = (int(part) for part in str(pattern).split(":"))
    except ValueError:
        n = m = 0
    if not isinstance(pattern, str) or not 0 < n < m:
        raise ValueError(f"pruner.pattern={pattern!r} is not 'N:M' with 0 < N < M, such as '2:4' or '4:8' "
                         f"(in YAML, quote it: an unquoted 2:4 reads as the number 124)")
    return n, m


def lowest(scores: list[torch.Tensor], sparsity: float, rule: str = "released") -> list[torch.Tensor]:
    """The lowest `sparsity` of the scores across all tensors together (one tensor: per layer; many:
    global), by `rule` (see the module's docstring)."""
    flat = torch.cat([s.detach().flatten().float() for s in scores])
    k = int(flat.numel() * sparsity)  # the released code's own expression, int(W.numel() * sparsity)
    if rule == "released":
        # sort(s)[k] is the (k+1)-th smallest: kthvalue finds it without sorting everything
        mask = flat <= flat.kthvalue(k + 1).values if k < flat.numel() else torch.ones_like(flat, dtype=torch.bool)
    elif rule == "exact":
        mask = torch.zeros_like(flat, dtype=torch.bool)
        if k > 0:
            threshold = flat.kthvalue(k).values
            mask = flat < threshold
            ties = torch.nonzero(flat == threshold)[: k - int(mask.sum()), 0]
            mask[ties] = True
    else:
        raise ValueError(f"pruner.mask_rule={rule!r} is not one of {list(MASK_RULES)}")
    return [part.view_as(s) for part, s in zip(mask.split([s.numel() for s in scores]), scores)]


def lowest_per_row(score: torch.Tensor, sparsity: float) -> torch.Tensor:
    """floor(columns x sparsity) lowest in every output row (Wanda's comparison group)."""
    k = int(score.shape[1] * sparsity)
    mask = torch.zeros_like(score, dtype=torch.bool)
    if k:
        mask.scatter_(1, torch.sort(score.float(), dim=1, stable=True).indices[:, :k], True)
    return mask


def n_of_m(score: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The m - n lowest of every m consecutive columns in each row."""
    rows, cols = score.shape
    if cols % m:
        raise ValueError(f"a layer with {cols} inputs cannot be split into groups of {m} for an N:M pattern")
    groups = score.float().reshape(rows, cols // m, m)
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(2, torch.sort(groups, dim=2, stable=True).indices[..., : m - n], True)
    return mask.view(rows, cols)
