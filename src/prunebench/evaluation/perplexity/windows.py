"""A corpus as consecutive, non-overlapping token windows: the perplexity protocol of pruning papers
(SparseGPT, Wanda: the test stream cut into model-length windows, the remainder dropped)."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from prunebench.evaluation.batching import DEFAULT_TOKENS
from prunebench.evaluation.encoding import window_prefix


def token_windows(ids: list[int], seq_len: int, prefix: list[int]) -> torch.Tensor:
    """[n, seq_len] windows; each holds `prefix` then seq_len - len(prefix) stream tokens, so each
    window's first position is context and the other seq_len - 1 are predicted."""
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} must be at least 2 (one context token, one predicted)")
    step = seq_len - len(prefix)
    n = len(ids) // step
    body = torch.tensor(ids[: n * step], dtype=torch.long).view(n, step)
    return torch.cat([torch.tensor(prefix, dtype=torch.long).expand(n, -1), body], dim=1)


class TokenWindowDataModule(L.LightningDataModule):
    """The whole corpus is tokenised once as one stream; batches of whole windows fit `batch_tokens`."""

    def __init__(self, corpus, tokenizer, seq_len: int, limit: int | None = None, batch_tokens: int = DEFAULT_TOKENS,
                 add_bos: bool | None = None):
        super().__init__()
        self.corpus, self.tokenizer, self.seq_len = corpus, tokenizer, seq_len
        self.limit, self.batch_tokens, self.add_bos = limit, batch_tokens, add_bos
        self.windows: torch.Tensor | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.windows is not None:
            return
        ids = self.tokenizer.encode(self.corpus.text(), add_special_tokens=False)
        windows = token_windows(ids, self.seq_len, window_prefix(self.tokenizer, self.add_bos))
        if not len(windows):
            raise ValueError(f"the corpus has {len(ids)} tokens: not one window of seq_len={self.seq_len}")
        self.windows = windows[: self.limit] if self.limit else windows

    @staticmethod
    def cost(window: torch.Tensor) -> int:
        """A window's positions, every one run: what the progress bar counts (windows x window length)."""
        return len(window)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.windows, batch_size=max(1, self.batch_tokens // self.seq_len))
