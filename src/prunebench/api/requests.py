"""Requests typed as lm-eval types them (lm_eval/api/instance.py): a task turns each document into
requests of one kind, the engine registered for that kind (evaluation/registry.py) answers them, and
the task scores a document from its responses (`process_results`).

Each document's requests travel together in a `Document`: the log-likelihood engine computes the
choices' shared context once, and a task scores a document from all of its responses at once.
A request's `images` are for an engine that feeds them to a vision-language model (through the model
adapter's processor); the text engines refuse a request that carries any."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol

# the request kinds; a task's `kind` names the engine that answers it
LOGLIKELIHOOD = "loglikelihood"
LOGLIKELIHOOD_ROLLING = "loglikelihood_rolling"
GENERATE_UNTIL = "generate_until"
CLASSIFY = "classify"  # a classifier's logits for (input, label) examples (evaluation/classification/engine.py)

# the model families whose adapter answers each text kind (a language model's tokenizer and LM head);
# `classify` tasks name their own (`families`), and a request with images needs a vision-language model
TEXT_FAMILIES = frozenset({"causal_lm", "moe", "vlm"})
KIND_FAMILIES = {LOGLIKELIHOOD: TEXT_FAMILIES, LOGLIKELIHOOD_ROLLING: TEXT_FAMILIES, GENERATE_UNTIL: TEXT_FAMILIES}
IMAGE_FAMILIES = frozenset({"vlm"})


# How the log-likelihood engine tokenises and scores a request (a task's `loglikelihood_scoring`):
# lm-eval's continuation (context and continuation tokenised jointly, the continuation's tokens
# scored), or OpenCompass's PPL (context + continuation as one text, every token after the first)
CONTINUATION = "continuation"
WHOLE_TEXT = "whole_text"


@dataclass
class Loglikelihood:
    """Response: a `LoglikelihoodResponse`."""

    context: str
    continuation: str
    images: tuple = ()


class LoglikelihoodResponse(NamedTuple):
    loglikelihood: float  # summed log p of the scored tokens
    is_greedy: bool  # every scored token is the argmax
    tokens: int  # how many tokens were scored


@dataclass
class GenerateUntil:
    """Response: the generated text, cut before the first stop string. The stop strings and the
    token budget are the task's (`until`, `max_gen_toks`): a batch shares them."""

    prompt: str
    images: tuple = ()


@dataclass
class LoglikelihoodRolling:
    """A whole text cut into consecutive windows of `seq_len` tokens (None: the model's length), the
    first `max_windows` of them (None: all; a protocol's own cap); response per window: (summed
    negative log-likelihood, tokens predicted). The engine makes each window a document."""

    text: object  # anything with .text() (corpora.TextCorpus): read only when the engine runs
    seq_len: int | None = None
    max_windows: int | None = None


@dataclass
class RollingText:
    """lm-eval's `loglikelihood_rolling`: a whole document's log-likelihood, answered by the
    loglikelihood engine as HFLM answers it (disjoint windows of the model's length, each a
    loglikelihood request on tokens, summed). Response: a `LoglikelihoodResponse` of the sum."""

    text: str
    images: tuple = ()


@dataclass
class Document:
    """One document's requests, all of its task's kind, in the order its responses come back."""

    doc_id: int
    requests: list
    doc: dict = field(repr=False, default_factory=dict)


class Task(Protocol):
    """What the job and the engines read of a task (tasks/ implements it; nothing here is imported
    back). `process_results(document, responses)` returns the document's record: what
    predictions/<task>.jsonl holds, per-document metric values included.

    The log-likelihood engine also asks `metric_objects(documents)` (the task's torchmetrics, built
    once every document is known) and reads `loglikelihood_scoring` (CONTINUATION when absent); a
    `classify` task streams `examples(limit)` and `collate(model)` instead of documents, its
    metrics seeing whole batches of logits (evaluation/classification/engine.py)."""

    kind: ClassVar[str]
    name: str
    metrics: list[str]
    primary: str
    lower_is_better: ClassVar[bool]

    def check(self) -> None: ...

    def instances(self, limit: int | None = None) -> list[Document]: ...

    def process_results(self, document: Document, responses: list) -> dict: ...
