"""OpenCompass's PPL scoring in a Lightning test loop: each option's whole text, BOS first (the
tokenizer's default, as OpenCompass tokenises with add_special_tokens=True), scored by the summed
cross-entropy of every token after the first divided by the number of tokens including the first
(OpenCompass divides by the input's non-pad tokens); the option with the lowest value wins, the
first on ties (its `ppl.index(min(ppl))`).

This is OpenCompass unbatched (its older HuggingFace model's default). Its batched base model pads
on the left, and then a padded row's first token is also scored, from a padding position: its
numbers move with the batch composition; ours do not.

The options of a document share the question's tokens: loglik.score_documents runs them once."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
import torchmetrics
from torch.utils.data import DataLoader

from prunebench.evaluation.encoding import encode
from prunebench.evaluation.loglik import common_prefix_len, score_documents
from prunebench.tasks.generation import mean_stderr
from prunebench.tasks.opencompass import PPLChoiceTask, PPLInstance


@dataclass
class EncodedOptions:
    """score_documents' request shape: every token after the first is a scored continuation token."""

    instance: PPLInstance
    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]

    @property
    def tokens(self) -> int:
        shared = common_prefix_len(self.inputs)
        return shared + len(self.inputs) * (max(len(x) for x in self.inputs) - shared)


class SequencePPLDataModule(L.LightningDataModule):
    """Whole documents per batch, longest first, within `batch_tokens` positions; texts longer than
    the model are cut from the left, as OpenCompass's tokenizer truncates."""

    def __init__(self, task: PPLChoiceTask, tokenizer, max_length: int, limit: int | None = None,
                 batch_tokens: int = 8192, add_bos: bool | None = None):
        super().__init__()
        self.task, self.tokenizer, self.max_length = task, tokenizer, max_length
        self.limit, self.batch_tokens, self.add_bos = limit, batch_tokens, add_bos
        self.batches: list[list[EncodedOptions]] = []

    def encode(self, inst: PPLInstance) -> EncodedOptions:
        full = [encode(self.tokenizer, text, self.add_bos)[-self.max_length:] for text in inst.texts]
        if any(len(ids) < 2 for ids in full):
            raise ValueError(f"task {self.task.name}, document {inst.doc_id}: an option text has fewer than 2 "
                             f"tokens, nothing to score")
        return EncodedOptions(inst, [ids[:-1] for ids in full], [len(ids) - 1 for ids in full],
                              [ids[1:] for ids in full])

    def setup(self, stage: str | None = None) -> None:
        if self.batches:
            return
        docs = sorted((self.encode(i) for i in self.task.instances(self.limit)), key=lambda d: -d.tokens)
        batch: list[EncodedOptions] = []
        for doc in docs:
            if batch and (len(batch) + 1) * batch[0].tokens > self.batch_tokens:
                self.batches.append(batch)
                batch = []
            batch.append(doc)
        if batch:
            self.batches.append(batch)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


def mean_cross_entropy(loglik: float, scored_tokens: int) -> float:
    """OpenCompass's per-option value: the first token is counted but never scored."""
    return -loglik / (scored_tokens + 1)


class SequencePPLModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task_name: str):
        super().__init__()
        self.model = model
        self.task_name = task_name
        self.acc = torchmetrics.MeanMetric()
        self.records: list[dict] = []

    def test_step(self, batch: list[EncodedOptions], batch_idx: int) -> None:
        for doc, scored in zip(batch, score_documents(self.model, batch)):
            ce = [mean_cross_entropy(ll, n) for (ll, _), n in zip(scored, doc.cont_lens)]
            pred = ce.index(min(ce))
            acc = float(pred == doc.instance.gold)
            self.acc.update(acc)
            self.records.append({"doc_id": doc.instance.doc_id, "gold": doc.instance.gold, "pred": pred,
                                 "mean_ce": ce, "texts": doc.instance.texts, "acc": acc})
        self.log(f"{self.task_name}/acc", self.acc, on_step=False, on_epoch=True, batch_size=len(batch))

    def stderr(self, name: str) -> float:
        return mean_stderr([r[name] for r in self.records])
