"""Calibration data for scorers: token windows drawn deterministically (per seed) from a text source."""

from __future__ import annotations

import random
from pathlib import Path

import torch


class Calibration:
    """`samples(tokenizer)` -> LongTensor [n_samples, seq_len]; the same seed gives the same windows."""

    def __init__(self, name: str, n_samples: int = 128, seq_len: int = 2048, seed: int = 0):
        self.name, self.n_samples, self.seq_len, self.seed = name, n_samples, seq_len, seed

    def texts(self) -> list[str]:
        raise NotImplementedError

    def check(self) -> None:
        """Raise a clear error if the data cannot be had, before any model loads."""

    def samples(self, tokenizer) -> torch.Tensor:
        ids = tokenizer.encode("\n\n".join(self.texts()), add_special_tokens=False)
        if len(ids) <= self.seq_len:
            raise ValueError(f"calib {self.name}: {len(ids)} tokens cannot fill one window of seq_len={self.seq_len}")
        rng = random.Random(self.seed)
        starts = [rng.randrange(0, len(ids) - self.seq_len) for _ in range(self.n_samples)]
        return torch.tensor([ids[s:s + self.seq_len] for s in starts], dtype=torch.long)


class FileCalibration(Calibration):
    """Any local UTF-8 text file (calib=file calib.path=FILE)."""

    def __init__(self, path: str, **kwargs):
        super().__init__(**kwargs)
        self.path = Path(path).expanduser()

    def check(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(f"calib.path: data file {str(self.path)!r} does not exist")

    def texts(self) -> list[str]:
        self.check()
        return [self.path.read_text(encoding="utf-8")]
