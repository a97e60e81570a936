"""How many real tokens each position of the model's next forward stands for: a side channel from
the engines to what observes a forward (MoE routing telemetry), for what the attention mask cannot
say. Generation extends the mask with ones for rows that already finished and keeps feeding them
padding; a causal scorer passes no mask for right padding it can ignore; a shared context computed
once may stand for one sequence per option. Numerics never read it."""

from __future__ import annotations

from contextlib import contextmanager

import torch


class CountedTokens:
    def __init__(self):
        self.weights: torch.Tensor | None = None  # [batch, width] of the coming forward; 0 = padding
        self.rows: torch.Tensor | None = None  # [batch] bool: the rows still generating

    @contextmanager
    def positions(self, weights: torch.Tensor):
        """The forwards inside count each position `weights` times (0: padding; 0 everywhere: a probe)."""
        self.weights = weights
        try:
            yield
        finally:
            self.weights = None

    @contextmanager
    def generating(self):
        """Rows are set by `finished` as generation goes; every row counts until then."""
        try:
            yield
        finally:
            self.rows = None

    def finished(self, done: torch.Tensor) -> None:
        """`done` [batch]: rows that stopped; their later forwards feed padding only."""
        self.rows = ~done if self.rows is None else self.rows & ~done

    def of(self, batch: int, width: int, attention_mask: torch.Tensor | None, device) -> torch.Tensor:
        """Long [batch * width]: what each position of a forward of that shape counts for."""
        if self.weights is not None:
            if tuple(self.weights.shape) != (batch, width):
                raise RuntimeError(f"counted positions {tuple(self.weights.shape)} set for a forward of shape "
                                   f"{(batch, width)}")
            counts = self.weights.to(device=device, dtype=torch.long)
        elif attention_mask is not None and attention_mask.dim() == 2:
            counts = attention_mask[:, -width:].to(device=device, dtype=torch.long)
        else:
            counts = torch.ones((batch, width), dtype=torch.long, device=device)
        if self.rows is not None:
            counts = counts * self.rows.to(device)[:, None]
        return counts.reshape(-1)
