"""A multiple-choice task, built the way lm-eval builds `output_type: multiple_choice` (spec §1.3-1.5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prunebench.tasks.sources import DocSource
from prunebench.tasks.template import gold_index, import_callable, resolve, resolve_choices, resolve_target

PER_DOC_METRICS = ("acc", "acc_norm")  # means over documents of a per-document hit
# over all documents at once, the chosen index as a class (lm-eval's GLUE: cola mcc, mrpc/qqp f1)
CORPUS_METRICS = ("mcc", "f1")
METRICS = PER_DOC_METRICS + CORPUS_METRICS


@dataclass
class Instance:
    """One document as loglikelihood requests: request i is (contexts[i], continuations[i])."""

    doc_id: int
    contexts: list[str]
    continuations: list[str]
    gold: int
    choice_lengths: list[int]  # characters of each choice, without the delimiter (acc_norm)
    doc: dict = field(repr=False, default_factory=dict)


@dataclass
class MultipleChoiceTask:
    name: str
    source: DocSource
    doc_to_text: object
    doc_to_choice: object
    doc_to_target: object
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    primary: str = "acc_norm"
    description: str = ""
    target_delimiter: str = " "
    process_docs: str | None = None

    def __post_init__(self):
        self.metrics = list(self.metrics)
        bad = [m for m in self.metrics if m not in METRICS]
        if bad:
            raise ValueError(f"task {self.name}: unknown metric(s) {bad}; valid: {list(METRICS)}")
        if self.primary not in self.metrics:
            raise ValueError(f"task {self.name}: primary={self.primary!r} must be one of metrics {self.metrics}")

    lower_is_better = False

    def evaluation(self, loaded, limit: int | None, options) -> tuple:
        """The (LightningDataModule, LightningModule) pair that evaluates this task in Trainer.test."""
        from prunebench.evaluation.datamodule import MultipleChoiceDataModule
        from prunebench.evaluation.module import MultipleChoiceModule

        data = MultipleChoiceDataModule(self, loaded.tokenizer, loaded.max_length, limit=limit,
                                        batch_tokens=options.batch_tokens, add_bos=options.add_bos)
        data.setup("test")
        num_choices = self.corpus_classes([doc.instance for batch in data.batches for doc in batch])
        return data, MultipleChoiceModule(loaded.model, self.name, self.metrics, num_choices)

    def corpus_classes(self, instances: list[Instance]) -> int:
        """The number of classes MCC / F1 see (the most choices of any document), refusing documents
        they cannot score before any model time is spent: a gold outside the choices (lm-eval scores
        it -100, which has no class), or F1, a two-class metric, on documents with other than two."""
        num_choices = max((len(i.continuations) for i in instances), default=2)
        corpus = [m for m in self.metrics if m in CORPUS_METRICS]
        if not corpus:
            return num_choices
        bad_gold = [i.doc_id for i in instances if not 0 <= i.gold < len(i.continuations)]
        if bad_gold:
            raise ValueError(f"task {self.name}: {corpus} need each document's gold among its choices; documents "
                             f"{bad_gold[:5]} have none (of {len(bad_gold)}); fix doc_to_target or drop {corpus}")
        if "f1" in corpus:
            other = [(i.doc_id, len(i.continuations)) for i in instances if len(i.continuations) != 2]
            if other:
                raise ValueError(f"task {self.name}: f1 is binary (choice 1 is the positive class) but documents "
                                 f"(doc_id, choices) {other[:5]} do not have exactly two choices")
        return num_choices

    def check(self) -> None:
        self.source.check()

    def docs(self, limit: int | None = None) -> list[dict]:
        docs = self.source.load()
        if self.process_docs:
            docs = import_callable(self.process_docs)(docs)
        return docs[:limit] if limit else docs

    def instance(self, doc_id: int, doc: dict) -> Instance:
        text = resolve(self.doc_to_text, doc)
        choices = resolve_choices(self.doc_to_choice, doc)
        if isinstance(text, int):
            # "multiple input" (WinoGrande): the choices are contexts sharing one continuation
            continuation = self.target_delimiter + str(resolve(self.doc_to_target, doc))
            return Instance(doc_id, [self.description + c for c in choices], [continuation] * len(choices),
                            text, [len(c) for c in choices], doc)
        target = resolve_target(self.doc_to_target, doc, choices)
        context = self.description + text
        return Instance(doc_id, [context] * len(choices), [self.target_delimiter + c for c in choices],
                        gold_index(target, choices), [len(c) for c in choices], doc)

    def instances(self, limit: int | None = None) -> list[Instance]:
        return [self.instance(i, doc) for i, doc in enumerate(self.docs(limit))]
