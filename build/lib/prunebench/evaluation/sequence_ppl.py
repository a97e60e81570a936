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

import lightning as L
import torch
import torchmetrics

from prunebench.evaluation.datamodule import EncodedDoc, MultipleChoiceDataModule
from prunebench.evaluation.encoding import encode
from prunebench.evaluation.loglik import score_documents
from prunebench.tasks.generation import mean_stderr
from prunebench.tasks.opencompass import PPLInstance


class SequencePPLDataModule(MultipleChoiceDataModule):
    """The multiple-choice batching with OpenCompass's encoding: each option's whole text is one
    request in score_documents' shape (every token after the first a scored continuation token);
    texts longer than the model are cut from the left, as OpenCompass's tokenizer truncates."""

    def encode(self, inst: PPLInstance) -> EncodedDoc:
        full = [encode(self.tokenizer, text, self.add_bos)[-self.max_length:] for text in inst.texts]
        if any(len(ids) < 2 for ids in full):
            raise ValueError(f"task {self.task.name}, document {inst.doc_id}: an option text has fewer than 2 "
                             f"tokens, nothing to score")
        return EncodedDoc(inst, [ids[:-1] for ids in full], [len(ids) - 1 for ids in full],
                          [ids[1:] for ids in full])


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

    def test_step(self, batch: list[EncodedDoc], batch_idx: int) -> None:
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
