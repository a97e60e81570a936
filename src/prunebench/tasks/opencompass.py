"""A multiple-choice task under OpenCompass's PPL protocol (spec §5; `PPLInferencer` with
`HuggingFaceBaseModel.get_ppl`): one complete text per option, question and option together, scored
by its mean token cross-entropy over the whole sequence; the lowest wins.

That is neither lm-eval's acc (the continuation's summed log-likelihood) nor its acc_norm (per
character): the shared question dilutes the length normalisation. Prompts are OpenCompass's own,
e.g. PIQA "The following makes sense: \\nQ: {goal}\\nA: {sol}\\n"."""

from __future__ import annotations

from dataclasses import dataclass, field

from prunebench.tasks.sources import DocSource
from prunebench.tasks.template import gold_index, import_callable, resolve, resolve_choices, resolve_target


@dataclass
class PPLInstance:
    doc_id: int
    texts: list[str]
    gold: int
    doc: dict = field(repr=False, default_factory=dict)


@dataclass
class PPLChoiceTask:
    """`prompt`: a template of one option's whole text; it sees the document's fields and `option`.
    `n_choices`: keep only documents with exactly this many options (OpenCompass's ARC loader drops
    the others)."""

    name: str
    source: DocSource
    prompt: str
    doc_to_choice: object
    doc_to_target: object
    process_docs: str | None = None
    n_choices: int | None = None
    metrics: list[str] = field(default_factory=lambda: ["acc"])
    primary: str = "acc"

    lower_is_better = False

    def __post_init__(self):
        if list(self.metrics) != ["acc"] or self.primary != "acc":
            raise ValueError(f"task {self.name}: OpenCompass's PPL protocol has one metric, acc")

    def check(self) -> None:
        self.source.check()

    def docs(self, limit: int | None = None) -> list[dict]:
        docs = self.source.load()
        if self.process_docs:
            docs = import_callable(self.process_docs)(docs)
        if self.n_choices:
            docs = [doc for doc in docs if len(resolve_choices(self.doc_to_choice, doc)) == self.n_choices]
        return docs[:limit] if limit else docs

    def instance(self, doc_id: int, doc: dict) -> PPLInstance:
        choices = resolve_choices(self.doc_to_choice, doc)
        texts = [resolve(self.prompt, {**doc, "option": choice}) for choice in choices]
        return PPLInstance(doc_id, texts, gold_index(resolve_target(self.doc_to_target, doc, choices), choices), doc)

    def instances(self, limit: int | None = None) -> list[PPLInstance]:
        return [self.instance(i, doc) for i, doc in enumerate(self.docs(limit))]

    def evaluation(self, loaded, limit: int | None, options) -> tuple:
        from prunebench.evaluation.sequence_ppl import SequencePPLDataModule, SequencePPLModule

        data = SequencePPLDataModule(self, loaded.tokenizer, loaded.max_length, limit=limit,
                                     batch_tokens=options.batch_tokens, add_bos=options.add_bos)
        return data, SequencePPLModule(loaded.model, self.name)
