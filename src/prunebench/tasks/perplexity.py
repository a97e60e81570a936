"""A perplexity task: a text corpus as one `loglikelihood_rolling` request, cut into consecutive
windows by the engine; perplexity over all predicted tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from prunebench.api.requests import LOGLIKELIHOOD_ROLLING, Document, LoglikelihoodRolling
from prunebench.corpora import TextCorpus


@dataclass
class PerplexityTask:
    """`seq_len`: window length in tokens, capped at the model's context length (null = that length).
    `max_windows`: a protocol's own cap (SparseGPT's C4 uses the first 256 windows), applied before
    `limit`."""

    kind: ClassVar[str] = LOGLIKELIHOOD_ROLLING
    lower_is_better: ClassVar[bool] = True

    name: str
    source: TextCorpus
    seq_len: int | None = None
    max_windows: int | None = None
    metrics: list[str] = field(default_factory=lambda: ["ppl"])
    primary: str = "ppl"

    def __post_init__(self):
        if list(self.metrics) != ["ppl"] or self.primary != "ppl":
            raise ValueError(f"task {self.name}: a perplexity task has one metric, ppl")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"task {self.name}: seq_len={self.seq_len} must be at least 2 or null")

    def check(self) -> None:
        self.source.check()

    def data_ids(self) -> set[str]:
        return self.source.data_ids()

    def instances(self, limit: int | None = None) -> list[Document]:
        """The corpus is one document; `limit` counts windows, so the engine applies it."""
        return [Document(0, [LoglikelihoodRolling(self.source, self.seq_len, self.max_windows)])]

    def process_results(self, window: Document, responses: list[tuple[float, int]]) -> dict:
        ((nll, tokens),) = responses
        return {"window": window.doc_id, "tokens": tokens, "nll": nll, "ppl": math.exp(nll / tokens)}

    def document_values(self, records: list[dict]) -> tuple[str, dict]:
        """Each window's (NLL, tokens): a resample's perplexity pools its windows' tokens as the
        metric does (a mean of per-window perplexities is another, larger number)."""
        return "weighted_perplexity", {r["window"]: (r["nll"], r["tokens"]) for r in records}
