"""A perplexity task: a text corpus cut into consecutive windows (evaluation/windows.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prunebench.corpora import TextCorpus


@dataclass
class PerplexityTask:
    """`seq_len`: window length in tokens, capped at the model's context length (null = that length).
    `max_windows`: a protocol's own cap (SparseGPT's C4 uses the first 256 windows), applied before
    `limit`."""

    name: str
    source: TextCorpus
    seq_len: int | None = None
    max_windows: int | None = None
    metrics: list[str] = field(default_factory=lambda: ["ppl"])
    primary: str = "ppl"

    lower_is_better = True

    def __post_init__(self):
        if list(self.metrics) != ["ppl"] or self.primary != "ppl":
            raise ValueError(f"task {self.name}: a perplexity task has one metric, ppl")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"task {self.name}: seq_len={self.seq_len} must be at least 2 or null")

    def check(self) -> None:
        self.source.check()

    def data_ids(self) -> set[str]:
        return self.source.data_ids()

    def window_length(self, max_length: int) -> int:
        return min(self.seq_len, max_length) if self.seq_len else max_length

    def evaluation(self, loaded, limit: int | None, options) -> tuple:
        from prunebench.evaluation.perplexity import PerplexityModule
        from prunebench.evaluation.windows import TokenWindowDataModule

        caps = [c for c in (self.max_windows, limit) if c]
        data = TokenWindowDataModule(self.source, loaded.tokenizer, self.window_length(loaded.max_length),
                                     limit=min(caps) if caps else None, batch_tokens=options.batch_tokens,
                                     add_bos=options.add_bos)
        return data, PerplexityModule(loaded.model, self.name)
