"""Documents -> tokenised requests -> length-sorted batches of whole documents."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
from torch.utils.data import DataLoader

from prunebench.evaluation.encoding import encode_pair, model_input
from prunebench.evaluation.loglik import common_prefix_len
from prunebench.tasks.multiple_choice import Instance, MultipleChoiceTask


@dataclass
class EncodedDoc:
    instance: Instance  # or any document with `doc_id` and `gold` (OpenCompass's PPLInstance)
    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]

    @property
    def tokens(self) -> int:
        """Positions the scorer runs for this document: the shared prefix once, then each choice's rest."""
        shared = common_prefix_len(self.inputs)
        return shared + len(self.inputs) * (max(len(x) for x in self.inputs) - shared)


def pack(items: list, cost, budget: int) -> list[list]:
    """Consecutive `items` (sorted costliest first) into batches whose rows x the first row's
    `cost` stays within `budget` positions; a row over budget alone still gets its own batch."""
    batches: list[list] = []
    for item in items:
        if batches and (len(batches[-1]) + 1) * cost(batches[-1][0]) <= budget:
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches


class MultipleChoiceDataModule(L.LightningDataModule):
    """A batch holds whole documents, scored together in one step; longest first so the first batch
    shows the peak memory (as lm-eval's Collator orders), and neighbours of similar length pad
    little. `batch_tokens` caps a batch's padded positions: the batch size follows from it."""

    def __init__(self, task: MultipleChoiceTask, tokenizer, max_length: int, limit: int | None = None,
                 batch_tokens: int = 8192, add_bos: bool | None = None):
        super().__init__()
        self.task, self.tokenizer, self.max_length = task, tokenizer, max_length
        self.limit, self.batch_tokens, self.add_bos = limit, batch_tokens, add_bos
        self.batches: list[list[EncodedDoc]] = []

    def encode(self, inst: Instance) -> EncodedDoc:
        inputs, lens, conts = [], [], []
        for ctx_text, cont_text in zip(inst.contexts, inst.continuations):
            ctx, cont = encode_pair(self.tokenizer, ctx_text, cont_text, self.add_bos)
            seq, clen = model_input(ctx, cont, self.max_length)
            inputs.append(seq)
            lens.append(clen)
            conts.append(cont[-clen:])
        return EncodedDoc(inst, inputs, lens, conts)

    def setup(self, stage: str | None = None) -> None:
        if self.batches:
            return
        docs = sorted((self.encode(i) for i in self.task.instances(self.limit)), key=lambda d: -d.tokens)
        self.batches = pack(docs, lambda d: d.tokens, self.batch_tokens)

    @property
    def n_docs(self) -> int:
        return sum(len(b) for b in self.batches)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)
