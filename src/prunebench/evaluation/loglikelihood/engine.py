"""The `loglikelihood` engine: documents -> tokenised requests -> length-sorted batches of whole
documents -> log-likelihoods (scorer.score_documents) -> the task's process_results -> torchmetrics.

Two tokenisations (the task's `loglikelihood_scoring`): lm-eval's continuation (context and
continuation tokenised jointly, left-truncated, the continuation's tokens scored), and OpenCompass's
PPL scoring, an option of this engine rather than a pipeline of its own: each request's text whole, BOS first (the tokenizer's default, as
OpenCompass tokenises with add_special_tokens=True), every token after the first scored; texts longer
than the model are cut from the left, as OpenCompass's tokenizer truncates. OpenCompass unbatched,
that is (its older HuggingFace model's default): its batched base model pads on the left, and then a
padded row's first token is also scored, from a padding position, so its numbers move with the batch
composition; ours do not."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import lightning as L
import torch
from torch.utils.data import DataLoader

from prunebench.api.metric_objects import records_stderr, update_from_records
from prunebench.api.requests import CONTINUATION, WHOLE_TEXT, Document, LoglikelihoodResponse, RollingText
from prunebench.evaluation.batching import DEFAULT_TOKENS, budget, pack, refuse_images
from prunebench.evaluation.encoding import encode, encode_all, encode_pair, model_input, pair_texts, rolling_windows
from prunebench.evaluation.loglikelihood.scorer import STEM_MIN, common_prefix_len, score_documents
from prunebench.evaluation.loglikelihood.lm_eval_numerics import score_documents_lm_eval
from prunebench.evaluation.numerics import lm_eval_rows
from prunebench.models.loaded import LoadedModel


@dataclass
class EncodedDoc:
    document: Document
    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]
    spans: list[int] | None = None  # inputs per request (a RollingText's windows); None: one each

    def responses(self, scored: list[tuple[float, bool]]) -> list[LoglikelihoodResponse]:
        """Per request: its inputs' log-likelihoods summed (HFLM sums a rolling request's windows)."""
        out, start = [], 0
        for span in self.spans or [1] * len(scored):
            part = slice(start, start + span)
            out.append(LoglikelihoodResponse(sum(ll for ll, _ in scored[part]), all(g for _, g in scored[part]),
                                              sum(self.cont_lens[part])))
            start += span
        return out

    @cached_property
    def tokens(self) -> int:
        """Positions the scorer runs for this document: the shared prefix once, then each choice's rest
        (read by the sort, the packing and the progress bar)."""
        shared = common_prefix_len(self.inputs)
        return shared + len(self.inputs) * (max(len(x) for x in self.inputs) - shared)


class LoglikelihoodDataModule(L.LightningDataModule):
    """A batch holds whole documents, scored together in one step; the costliest batch first so it
    shows the peak memory (as lm-eval's Collator orders), neighbours of similar length so they pad
    little, and documents that begin alike (few-shot examples) together so their stem runs once.
    `batch_tokens` caps a batch's padded positions: the batch size follows from it.
    `whole_task`: one batch of every document, for eval.numerics=lm_eval, whose rows are batched
    across the whole task as lm-eval's are."""

    def __init__(self, task, model: LoadedModel, limit: int | None = None, batch_tokens: int = DEFAULT_TOKENS,
                 add_bos: bool | None = None, whole_task: bool = False):
        super().__init__()
        self.task, self.tokenizer, self.max_length = task, model.tokenizer, model.max_length
        self.limit, self.batch_tokens, self.add_bos, self.whole_task = limit, batch_tokens, add_bos, whole_task
        self.truncated = 0  # documents cut to fit the model (job.py logs <task>/n_truncated and warns)
        self.scoring = getattr(task, "loglikelihood_scoring", CONTINUATION)
        if self.scoring not in (CONTINUATION, WHOLE_TEXT):
            raise ValueError(f"task {task.name}: loglikelihood_scoring={self.scoring!r}; valid: "
                             f"{[CONTINUATION, WHOLE_TEXT]}")
        self.batches: list[list[EncodedDoc]] = []

    def texts(self, document: Document) -> list[str]:
        """The texts `encode` tokenises for this document."""
        if self.scoring == WHOLE_TEXT:
            return [r.context + r.continuation for r in document.requests]
        return [text for r in document.requests for text in (
            [r.text] if isinstance(r, RollingText) else pair_texts(r.context, r.continuation) if r.context else [])]

    def encode(self, document: Document, known: dict[str, list[int]] | None = None) -> EncodedDoc:
        """Counts in `truncated` a document whose tokens were cut to fit the model (its start dropped).
        `known`: its texts already encoded (`encode_all` of `texts`); any other is encoded here."""
        refuse_images(self.task, document)
        if self.scoring == WHOLE_TEXT:
            whole = [encode(self.tokenizer, r.context + r.continuation, self.add_bos, known) for r in document.requests]
            self.truncated += any(len(ids) > self.max_length for ids in whole)
            full = [ids[-self.max_length:] for ids in whole]
            if any(len(ids) < 2 for ids in full):
                raise ValueError(f"task {self.task.name}, document {document.doc_id}: an option text has fewer "
                                 f"than 2 tokens, nothing to score")
            return EncodedDoc(document, [ids[:-1] for ids in full], [len(ids) - 1 for ids in full],
                              [ids[1:] for ids in full])
        inputs, lens, conts, spans, cut = [], [], [], [], False
        for request in document.requests:
            if isinstance(request, RollingText):
                pairs = rolling_windows(self.tokenizer, request.text, self.max_length, self.add_bos, known)
            else:
                pairs = [encode_pair(self.tokenizer, request.context, request.continuation, self.add_bos, known)]
            for ctx, cont in pairs:
                seq, clen = model_input(ctx, cont, self.max_length)
                cut = cut or len(seq) < len(ctx) + len(cont) - 1  # (the last token is never fed)
                inputs.append(seq)
                lens.append(clen)
                conts.append(cont[-clen:])
            spans.append(len(pairs))
        self.truncated += cut
        return EncodedDoc(document, inputs, lens, conts, spans)

    def setup(self, stage: str | None = None) -> None:
        if self.batches:
            return
        documents = list(self.task.instances(self.limit))
        known = encode_all(self.tokenizer, (t for d in documents for t in self.texts(d)), self.add_bos)
        docs = sorted((self.encode(d, known) for d in documents), key=lambda d: -d.tokens)
        if self.whole_task:
            self.batches = [docs]
            return
        # documents that begin alike (a task's few-shot examples) are batched together, so that the
        # scorer runs their stem once (scorer.stems); the others as before, by length
        clusters = defaultdict(list)
        for doc in docs:
            clusters[tuple(doc.inputs[0][:STEM_MIN])].append(doc)
        alike = [c for c in clusters.values() if len(c) > 1]
        rest = [doc for c in clusters.values() if len(c) == 1 for doc in c]
        batches = [batch for cluster in [*alike, rest] for batch in pack(cluster, self.cost, self.batch_tokens)]
        self.batches = sorted(batches, key=lambda b: -b[0].tokens)  # the costliest first: its peak shows first

    @staticmethod
    def cost(doc: EncodedDoc) -> int:
        """What batches are packed by, and what the progress bar counts."""
        return doc.tokens

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


class LoglikelihoodModule(L.LightningModule):
    """Scores each batch, hands every document's responses to the task's process_results and feeds
    the records to the task's metrics (api.metric_objects.update_from_records)."""

    def __init__(self, model: LoadedModel, task, metrics: dict, lm_eval_batch_size: int | None = None):
        super().__init__()
        self.model, self.adapter, self.task = model.model, model, task
        # rows per forward of eval.numerics=lm_eval; None: the fast scorer
        self.lm_eval_batch_size = lm_eval_batch_size
        self.metrics = torch.nn.ModuleDict(metrics)
        self.corpus = getattr(task, "corpus_metrics", None)
        self.corpus_stderr: dict[str, float] = {}
        self.records: list[dict] = []
        # OpenCompass runs each option's whole text alone: its shared context counts once per option
        self.context_per_option = getattr(task, "loglikelihood_scoring", CONTINUATION) == WHOLE_TEXT

    def score(self, batch: list[EncodedDoc]) -> list[list[tuple[float, bool]]]:
        if self.lm_eval_batch_size:
            return score_documents_lm_eval(self.adapter, batch, self.lm_eval_batch_size)
        return score_documents(self.adapter, batch, context_per_option=self.context_per_option)

    def test_step(self, batch: list[EncodedDoc], batch_idx: int) -> None:
        records = [self.task.process_results(doc.document, doc.responses(scored))
                   for doc, scored in zip(batch, self.score(batch))]
        update_from_records(self.metrics, records)
        self.records += records
        for name, metric in self.metrics.items():
            self.log(f"{self.task.name}/{name}", metric, on_step=False, on_epoch=True, batch_size=len(batch))

    def on_test_epoch_end(self) -> None:
        """A task aggregating its records itself (an lm-eval task: lm-eval's aggregations) logs its
        values here: `<task>/<metric>`, or a member's `<member>/<metric>` as named."""
        if self.corpus:
            values, self.corpus_stderr = self.corpus(self.records)
            for name, value in values.items():
                self.log(name if "/" in name else f"{self.task.name}/{name}", value)

    def stderr(self, name: str) -> float:
        if self.corpus:
            return self.corpus_stderr.get(name, float("nan"))
        return records_stderr(self.metrics[name], name, self.records)


def evaluation(task, model: LoadedModel, limit: int | None, options) -> tuple[LoglikelihoodDataModule,
                                                                               LoglikelihoodModule]:
    """The task's metrics see every document before any model time is spent (`metric_objects`:
    the classes MCC and F1 count, and documents they cannot score refused)."""
    rows = lm_eval_rows(options)
    if not rows:
        model.check_lm_head()
    data = LoglikelihoodDataModule(task, model, limit, batch_tokens=budget(options, model.device, scoring=True),
                                   add_bos=options.add_bos,
                                   whole_task=bool(rows))
    data.setup("test")
    metrics = {} if hasattr(task, "corpus_metrics") else task.metric_objects(
        [doc.document for batch in data.batches for doc in batch])
    return data, LoglikelihoodModule(model, task, metrics, rows)
