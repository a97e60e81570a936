"""A multiple-choice task under OpenCompass's PPL protocol (`PPLInferencer` with
`HuggingFaceBaseModel.get_ppl`): one complete text per option, question and option together, scored
by its mean token cross-entropy over the whole sequence; the lowest wins.

That is neither lm-eval's acc (the continuation's summed log-likelihood) nor its acc_norm (per
character): the shared question dilutes the length normalisation. Prompts are OpenCompass's own,
e.g. PIQA "The following makes sense: \\nQ: {goal}\\nA: {sol}\\n".

In-context examples (CommonsenseQA's config has 8) come before the question, each written with the
same prompt and its gold option, and the whole prompt list is flattened as OpenCompass flattens it for
a base model. Which examples: OpenCompass picks them with a retriever; its MDL retriever needs a
second model's search and is not reproduced, so examples are none or drawn as its RandomRetriever
draws them. torchmetrics is imported when a job scores, not when validation builds the task."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from prunebench.api.requests import LOGLIKELIHOOD, WHOLE_TEXT, Document, Loglikelihood, LoglikelihoodResponse
from prunebench.tasks.sources import BenchmarkSource, DocSource
from prunebench.tasks.template import gold_index, import_callable, resolve, resolve_choices, resolve_target

if TYPE_CHECKING:
    import torchmetrics

RETRIEVERS = ("none", "random")
# OpenCompass's BaseRetriever.generate_ice for a per-label template (commonsenseqa_ppl_5545e2's
# `_ice_template`, prompt_type "origin"): ice_separator "\n" after each example, ice_eos_token "\n"
# after the last (opencompass/openicl/icl_retriever/icl_base_retriever.py, BaseRetriever defaults).
# A zero-shot config's ZeroRetriever adds nothing.
ICE_SEPARATOR = ICE_EOS = "\n"


def flatten(parts: list[str]) -> str:
    """OpenCompass's LMTemplateParser.parse_template without a meta template (a base model): every
    non-empty item of the prompt list (a round's HUMAN and BOT prompts, the separator strings between
    examples) joined by "\\n", section markers dropped (opencompass/models/base.py at 3ce9b0a4)."""
    return "\n".join(part for part in parts if part)


def mean_cross_entropy(response: LoglikelihoodResponse) -> float:
    """OpenCompass's per-option value: summed cross-entropy over the tokens after the first, divided
    by all of them (it divides by the input's non-pad tokens; the first is counted, never scored)."""
    return -response.loglikelihood / (response.tokens + 1)


@dataclass
class PPLInstance(Document):
    """One document, each option's whole text a loglikelihood request (its context empty)."""

    gold: int = -1

    @property
    def texts(self) -> list[str]:
        return [r.continuation for r in self.requests]


@dataclass
class PPLChoiceTask:
    """`prompt`: a template of one option's whole text; it sees the document's fields and `option`.
    `n_choices`: keep only documents with exactly this many options (OpenCompass's ARC loader drops
    the others).

    In-context examples: `fewshot_path` (a train file, read by `fewshot_reader`, or a dataset folder)
    and `retriever`: `none`, or `random` (`num_fewshot` per document, numpy seeded with `seed`);
    null = random when there is a train file."""

    kind: ClassVar[str] = LOGLIKELIHOOD
    loglikelihood_scoring: ClassVar[str] = WHOLE_TEXT
    lower_is_better: ClassVar[bool] = False

    name: str
    source: DocSource
    prompt: str
    doc_to_choice: object
    doc_to_target: object
    process_docs: str | None = None
    n_choices: int | None = None
    metrics: list[str] = field(default_factory=lambda: ["acc"])
    primary: str = "acc"
    fewshot_path: str | None = None
    fewshot_reader: str = "prunebench.tasks.sources.read_records"
    retriever: str | None = None
    num_fewshot: int = 8
    seed: int = 1

    def __post_init__(self):
        if list(self.metrics) != ["acc"] or self.primary != "acc":
            raise ValueError(f"task {self.name}: OpenCompass's PPL protocol has one metric, acc")
        if self.retriever is None:
            self.retriever = "random" if self.fewshot_path else "none"
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"retriever={self.retriever!r}; valid: {list(RETRIEVERS)} (OpenCompass's MDL "
                             f"retriever, a search scored by a second model, is not reproduced)")
        if self.retriever == "random" and not self.fewshot_path:
            raise ValueError("retriever=random draws in-context examples from a train file: set fewshot_path=FILE")
        if self.retriever == "random" and self.num_fewshot < 1:
            raise ValueError(f"num_fewshot={self.num_fewshot} must be >= 1 with retriever=random")
        self.fewshot = (BenchmarkSource(hub=None, split="train", path=self.fewshot_path, reader=self.fewshot_reader)
                        if self.retriever == "random" else None)

    def check(self) -> None:
        self.source.check()
        if self.fewshot is None:
            return
        where = self.fewshot.location()
        if not where.exists():
            raise FileNotFoundError(f"fewshot_path: {str(where)!r} does not exist")
        if where.resolve() == Path(self.source.describe()).expanduser().resolve():
            raise ValueError(f"fewshot_path={self.fewshot_path!r} is the evaluated file: its in-context "
                             f"examples would show the model the answers; use the train split")
        examples = self.examples()
        if len(examples) < self.num_fewshot:
            raise ValueError(f"fewshot_path={self.fewshot_path!r} holds {len(examples)} usable examples, "
                             f"fewer than num_fewshot={self.num_fewshot}")
        for i, doc in enumerate(examples):
            if self.gold(doc)[1] < 0:
                raise ValueError(f"fewshot_path={self.fewshot_path!r}, example {i}: its answer is not among "
                                 f"its options")

    def prepare(self, docs: list[dict]) -> list[dict]:
        """The evaluated documents and the in-context examples alike, as OpenCompass's loader
        prepares every split the same way."""
        if self.process_docs:
            docs = import_callable(self.process_docs)(docs)
        if self.n_choices:
            docs = [doc for doc in docs if len(resolve_choices(self.doc_to_choice, doc)) == self.n_choices]
        return docs

    def docs(self, limit: int | None = None) -> list[dict]:
        docs = self.prepare(self.source.load())
        return docs[:limit] if limit else docs

    def examples(self) -> list[dict]:
        return self.prepare(self.fewshot.load()) if self.fewshot else []

    def gold(self, doc: dict) -> tuple[list[str], int]:
        choices = resolve_choices(self.doc_to_choice, doc)
        return choices, gold_index(resolve_target(self.doc_to_target, doc), choices)

    def text(self, doc: dict, option: str) -> str:
        return resolve(self.prompt, {**doc, "option": option})

    def shots(self, n_docs: int, n_examples: int) -> list[list[int]]:
        """OpenCompass's RandomRetriever.retrieve: np.random.seed(seed), then per document, in order,
        np.random.choice(len(train), ice_num, replace=False). The draws run in document order, so
        the first N documents get the same examples whatever `limit` is."""
        if self.fewshot is None:
            return [[] for _ in range(n_docs)]
        rng = np.random.RandomState(self.seed)
        return [rng.choice(n_examples, self.num_fewshot, replace=False).tolist() for _ in range(n_docs)]

    def instance(self, doc_id: int, doc: dict, shots: list[str] = ()) -> PPLInstance:
        """`shots`: the in-context examples' texts, each its prompt with its gold option."""
        context = [part for shot in shots for part in (shot, ICE_SEPARATOR)] + ([ICE_EOS] if shots else [])
        choices, gold = self.gold(doc)
        return PPLInstance(doc_id, [Loglikelihood("", flatten([*context, self.text(doc, choice)])) for choice in choices],
                           doc, gold)

    def instances(self, limit: int | None = None) -> list[PPLInstance]:
        docs, examples = self.docs(limit), self.examples()
        picks = self.shots(len(docs), len(examples))
        shot_texts = {}
        for i in {i for pick in picks for i in pick}:
            choices, gold = self.gold(examples[i])
            shot_texts[i] = self.text(examples[i], choices[gold])
        return [self.instance(i, doc, [shot_texts[j] for j in pick]) for i, (doc, pick) in enumerate(zip(docs, picks))]

    def metric_objects(self, instances: list[PPLInstance]) -> dict[str, torchmetrics.Metric]:
        import torchmetrics

        return {"acc": torchmetrics.MeanMetric()}

    def process_results(self, instance: PPLInstance, responses: list[LoglikelihoodResponse]) -> dict:
        """The option with the lowest mean cross-entropy wins, the first on ties (its `ppl.index(min(ppl))`)."""
        ce = [mean_cross_entropy(r) for r in responses]
        pred = ce.index(min(ce))
        return {"doc_id": instance.doc_id, "gold": instance.gold, "pred": pred, "mean_ce": ce,
                "texts": instance.texts, "acc": float(pred == instance.gold)}
