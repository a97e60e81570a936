"""A multiple-choice task, built the way lm-eval builds `output_type: multiple_choice`:
each choice a `loglikelihood` request, the highest summed (acc) or per-character (acc_norm)
log-likelihood the prediction. torchmetrics is imported when a job scores, not when validation
builds the task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import jinja2

from prunebench.api.metrics import first_argmax
from prunebench.api.requests import LOGLIKELIHOOD, Document, Loglikelihood, LoglikelihoodResponse
from prunebench.tasks.duplicates import warn_duplicate_ids, warn_repeated_choices
from prunebench.tasks.sources import DocSource
from prunebench.tasks.template import gold_index, import_callable, resolve, resolve_choices, resolve_target

if TYPE_CHECKING:
    import torchmetrics

PER_DOC_METRICS = ("acc", "acc_norm")  # means over documents of a per-document hit
# over all documents at once, the chosen index as a class (lm-eval's GLUE: cola mcc, mrpc/qqp f1)
CORPUS_METRICS = ("mcc", "f1")
METRICS = PER_DOC_METRICS + CORPUS_METRICS


@dataclass
class Instance(Document):
    """One document as loglikelihood requests, one per choice."""

    gold: int = -1
    choice_lengths: list[int] = field(default_factory=list)  # characters of each choice, without the delimiter (acc_norm)

    @property
    def contexts(self) -> list[str]:
        return [r.context for r in self.requests]

    @property
    def continuations(self) -> list[str]:
        return [r.continuation for r in self.requests]


@dataclass
class MultipleChoiceTask:
    kind: ClassVar[str] = LOGLIKELIHOOD
    # its prompts take a chat format (evaluation/chat.py)
    renders_chat: ClassVar[bool] = True
    lower_is_better: ClassVar[bool] = False

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
    # the chat format its prompts are rendered in (evaluation/chat.py), set before its requests are
    # built; None: the raw prompts
    chat: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.metrics = list(self.metrics)
        bad = [m for m in self.metrics if m not in METRICS]
        if bad:
            raise ValueError(f"task {self.name}: unknown metric(s) {bad}; valid: {list(METRICS)}")
        if self.primary not in self.metrics:
            raise ValueError(f"task {self.name}: primary={self.primary!r} must be one of metrics {self.metrics}")

    def metric_objects(self, instances: list[Instance]) -> dict[str, torchmetrics.Metric]:
        """`acc` / `acc_norm` are means of per-document hits; `mcc` / `f1` (lm-eval's GLUE metrics) are
        computed over all documents at once, with the chosen index (argmax log-likelihood) as the
        predicted class and the gold index as the label."""
        import torchmetrics

        from prunebench.api.metric_objects import CLASS_METRICS

        num_choices = self.corpus_classes(instances)
        return {m: torchmetrics.MeanMetric() if m in PER_DOC_METRICS else CLASS_METRICS[m][0](num_choices)
                for m in self.metrics}

    def corpus_classes(self, instances: list[Instance]) -> int:
        """The number of classes MCC / F1 see (the most choices of any document), refusing documents
        they cannot score before any model time is spent: F1, a two-class metric, on documents with
        other than two choices (a gold outside the choices is refused when the document is built)."""
        num_choices = max((len(i.requests) for i in instances), default=2)
        corpus = [m for m in self.metrics if m in CORPUS_METRICS]
        if not corpus:
            return num_choices
        if "f1" in corpus:
            other = [(i.doc_id, len(i.requests)) for i in instances if len(i.requests) != 2]
            if other:
                raise ValueError(f"task {self.name}: f1 is binary (choice 1 is the positive class) but documents "
                                 f"(doc_id, choices) {other[:5]} do not have exactly two choices")
        return num_choices

    def check(self) -> None:
        """The source, and for a local one every document: a missing template field, no choices or
        a gold outside the choices fail here, naming the document, before any model loads; repeated
        ids or choices are warned about (tasks/duplicates.py)."""
        self.source.check()
        if self.source.local:
            instances = self.instances()
            warn_duplicate_ids(self.name, [instance.doc for instance in instances], self.source.describe())
            warn_repeated_choices(self.name, instances, self.source.describe())

    def docs(self, limit: int | None = None) -> list[dict]:
        docs = self.source.load()
        if self.process_docs:
            docs = import_callable(self.process_docs)(docs)
        return docs[:limit] if limit else docs

    def instance(self, doc_id: int, doc: dict) -> Instance:
        """Raises ValueError naming the document where it cannot be scored (lm-eval would score a gold
        outside the choices as -100, i.e. wrong, silently)."""
        where = f"task {self.name}, document {doc_id} of {self.source.describe()}"
        try:
            text = resolve(self.doc_to_text, doc)
            choices = resolve_choices(self.doc_to_choice, doc)
            target = resolve(self.doc_to_target, doc) if isinstance(text, int) else resolve_target(self.doc_to_target, doc)
        except jinja2.UndefinedError as err:
            raise ValueError(f"{where}: a template names a field the document lacks ({err.message}); "
                             f"its fields: {sorted(doc)[:12]}") from None
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if not choices:
            raise ValueError(f"{where}: no choices (doc_to_choice={self.doc_to_choice!r} gave {choices!r})")
        gold = text if isinstance(text, int) else gold_index(target, choices)
        if not 0 <= gold < len(choices):
            raise ValueError(f"{where}: the gold answer {text if isinstance(text, int) else target!r} is not one of "
                             f"its {len(choices)} choices (an index in 0..{len(choices) - 1} or one of {choices[:4]})")
        delimiter = self.target_delimiter if self.chat is None else self.chat.target_delimiter(self.target_delimiter)
        if isinstance(text, int):
            # "multiple input" (WinoGrande): the choices are contexts sharing one continuation
            continuation = delimiter + str(target)
            return Instance(doc_id, [Loglikelihood(self.context(c), continuation) for c in choices], doc,
                            text, [len(c) for c in choices])
        context = self.context(text)
        return Instance(doc_id, [Loglikelihood(context, delimiter + c) for c in choices], doc,
                        gold, [len(c) for c in choices])

    def context(self, text: str) -> str:
        """The description before the document's text; in a chat format, the turns lm-eval builds."""
        return self.description + text if self.chat is None else self.chat.context(text, self.description)

    def instances(self, limit: int | None = None) -> list[Instance]:
        return [self.instance(i, doc) for i, doc in enumerate(self.docs(limit))]

    def process_results(self, instance: Instance, responses: list[LoglikelihoodResponse]) -> dict:
        lls = [r.loglikelihood for r in responses]
        pred = first_argmax(lls)
        pred_norm = first_argmax([ll / n if n else ll for ll, n in zip(lls, instance.choice_lengths)])
        values = {"acc": float(pred == instance.gold), "acc_norm": float(pred_norm == instance.gold)}
        return {"doc_id": instance.doc_id, "gold": instance.gold, "pred": pred, "pred_norm": pred_norm,
                "loglikelihoods": lls, "is_greedy": [r.is_greedy for r in responses],
                "context": instance.contexts[0], "continuations": instance.continuations,
                **{m: values[m] for m in self.metrics if m in PER_DOC_METRICS}}
