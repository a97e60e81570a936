"""generate_until tasks in a Lightning test loop: prompts -> tokens -> batched greedy generation ->
answer filters -> exact match, kept in torchmetrics per member task and aggregated per group."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
import torchmetrics
from torch.utils.data import DataLoader

from prunebench.evaluation.datamodule import pack
from prunebench.evaluation.encoding import encode
from prunebench.evaluation.generate import Generator
from prunebench.tasks.generation import GenerateUntilTask, Request, TaskGroup, mean_stderr


@dataclass
class EncodedRequest:
    request: Request
    tokens: list[int]


class GenerationDataModule(L.LightningDataModule):
    """Prompts tokenised with lm-eval's BOS rule and left-truncated to leave room for the
    generation (max_length - max_gen_toks, as HFLM); longest first (lm-eval's order, and the first
    batch shows the peak memory); a batch's rows x (longest prompt + max_gen_toks) fit the budget."""

    def __init__(self, tasks: list[GenerateUntilTask], tokenizer, max_length: int, max_gen_toks: int,
                 limit: int | None = None, batch_tokens: int = 8192, add_bos: bool | None = None):
        super().__init__()
        if max_gen_toks >= max_length:
            raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for a prompt in the model's "
                             f"{max_length} positions")
        self.tasks, self.tokenizer, self.max_length, self.max_gen_toks = tasks, tokenizer, max_length, max_gen_toks
        self.limit, self.batch_tokens, self.add_bos = limit, batch_tokens, add_bos
        self.batches: list[list[EncodedRequest]] = []

    def setup(self, stage: str | None = None) -> None:
        if self.batches:
            return
        room = self.max_length - self.max_gen_toks
        encoded = [EncodedRequest(r, encode(self.tokenizer, r.prompt, self.add_bos)[-room:])
                   for task in self.tasks for r in task.requests(self.limit)]
        encoded.sort(key=lambda e: (-len(e.tokens), e.request.prompt))
        self.batches = pack(encoded, lambda e: len(e.tokens) + self.max_gen_toks, self.batch_tokens)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


class GenerationModule(L.LightningModule):
    """Logs `<member>/<metric>` and its stderr for every member task and, for a group,
    `<group>/<metric>` (module.stderr gives the group's standard error)."""

    def __init__(self, model: torch.nn.Module, tokenizer, tasks: list[GenerateUntilTask], group: TaskGroup | None):
        super().__init__()
        self.model = model
        self.tasks = {task.name: task for task in tasks}
        self.group = group
        first = tasks[0]
        self.generator = Generator(model, tokenizer, first.until, first.max_gen_toks)
        self.metric_names = first.metrics
        self.metrics = torch.nn.ModuleDict({
            f"{task}:{metric}": torchmetrics.MeanMetric() for task in self.tasks for metric in self.metric_names})
        self.records: list[dict] = []
        self.group_stderr: dict[str, float] = {}

    def test_step(self, batch: list[EncodedRequest], batch_idx: int) -> None:
        responses = self.generator([item.tokens for item in batch])
        for item, response in zip(batch, responses):
            request = item.request
            answers, values = self.tasks[request.task].score(response, request)
            for metric, value in values.items():
                self.metrics[f"{request.task}:{metric}"].update(value)
            self.records.append({"task": request.task, "doc_id": request.doc_id, "prompt": request.prompt,
                                 "target": request.target, "response": response,
                                 **{f"{m}_answer": a for m, a in answers.items()}, **values})

    def on_test_epoch_end(self) -> None:
        sizes = {name: sum(r["task"] == name for r in self.records) for name in self.tasks}
        for metric in self.metric_names:
            means, stderrs = [], []
            for name in self.tasks:
                mean = float(self.metrics[f"{name}:{metric}"].compute())
                stderr = mean_stderr([r[metric] for r in self.records if r["task"] == name])
                means.append(mean)
                stderrs.append(stderr)
                self.log(f"{name}/{metric}", mean)
                if self.group is not None:
                    self.log(f"{name}/{metric}_stderr", stderr)
            if self.group is not None:
                score, stderr = self.group.aggregate(means, stderrs, list(sizes.values()))
                self.log(f"{self.group.name}/{metric}", score)
                self.group_stderr[metric] = stderr

    def stderr(self, name: str) -> float:
        if self.group is not None:
            return self.group_stderr[name]
        return mean_stderr([r[name] for r in self.records])
