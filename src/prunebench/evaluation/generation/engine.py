"""The `generate_until` engine: prompts -> tokens -> batched greedy generation (greedy.py) -> the
task's process_results (answer filters, exact match) -> torchmetrics per member task, aggregated
per group.

Requests that carry images (a vision-language model's) take the model's own path: the prompt is
rendered with the processor's chat template, and each batch goes through the processor (images
opened only then, so a benchmark's thousands of images are never held at once).

A task here is one generate_until task or a group of them (BBH's subtasks) sharing their stop
strings and token budget: `members` are evaluated in one test loop, their requests batched together."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
import torchmetrics
from torch.utils.data import DataLoader

from prunebench.api.metrics import mean_stderr
from prunebench.api.requests import Document
from prunebench.evaluation.batching import DEFAULT_TOKENS, budget, pack, refuse_images
from prunebench.evaluation.encoding import encode
from prunebench.evaluation.generation.greedy import Generator
from prunebench.models.loaded import LoadedModel


@dataclass
class EncodedRequest:
    document: Document  # its one request: a GenerateUntil; `task` names the member it belongs to
    tokens: list[int]  # with images: the rendered prompt's, each image one token (the processor expands it)
    text: str | None = None  # with images: the prompt rendered with the chat template
    image_tokens: int = 0  # the positions its images add

    @property
    def length(self) -> int:
        return len(self.tokens) + self.image_tokens


class GenerationDataModule(L.LightningDataModule):
    """Prompts tokenised with lm-eval's BOS rule and left-truncated to leave room for the
    generation (max_length - max_gen_toks, as HFLM); longest first (lm-eval's order, and the first
    batch shows the peak memory); a batch's rows x (longest prompt + max_gen_toks) fit the budget."""

    def __init__(self, task, model: LoadedModel, limit: int | None = None, batch_tokens: int = DEFAULT_TOKENS,
                 add_bos: bool | None = None):
        super().__init__()
        if task.max_gen_toks >= model.max_length:
            raise ValueError(f"max_gen_toks={task.max_gen_toks} leaves no room for a prompt in the model's "
                             f"{model.max_length} positions")
        self.task, self.model, self.tokenizer, self.max_length = task, model, model.tokenizer, model.max_length
        self.limit, self.batch_tokens, self.add_bos = limit, batch_tokens, add_bos
        self.batches: list[list[EncodedRequest]] = []
        self.truncated = 0  # prompts cut from the left to leave room (job.py logs <task>/n_truncated and warns)

    def setup(self, stage: str | None = None) -> None:
        if self.batches:
            return
        room = self.max_length - self.task.max_gen_toks
        documents = self.task.instances(self.limit)
        encoded = [self.encode(d, room) for d in documents]
        encoded.sort(key=lambda e: (-e.length, e.document.requests[0].prompt))
        self.batches = pack(encoded, self.cost, self.batch_tokens)

    def cost(self, item: EncodedRequest) -> int:
        """The positions a request may take: its prompt and the generation's room (what batches are
        packed by, and what the progress bar counts)."""
        return item.length + self.task.max_gen_toks

    def encode(self, document: Document, room: int) -> EncodedRequest:
        request = document.requests[0]
        if not request.images:
            tokens = encode(self.tokenizer, request.prompt, self.add_bos)
            self.truncated += len(tokens) > room
            return EncodedRequest(document, tokens[-room:])
        if self.model.processor is None:
            refuse_images(self.task, document)
        text = self.model.chat_prompt(request.prompt, len(request.images))
        encoded = EncodedRequest(document, self.tokenizer(text)["input_ids"], text,
                                 len(request.images) * (self.model.image_tokens - 1))
        if encoded.length > room:
            # cutting the prompt's start would cut image tokens the processor must see whole
            raise ValueError(f"task {self.task.name}, document {document.doc_id}: the prompt with its images takes "
                             f"{encoded.length} positions, more than the {room} max_length - max_gen_toks leaves")
        return encoded

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


class GenerationModule(L.LightningModule):
    """Logs `<member>/<metric>` and its stderr for every member task and, for a group,
    `<group>/<metric>` (module.stderr gives the group's standard error). A task with
    `corpus_metrics(records)` (a judged one) scores all its records together instead of averaging
    per-document values."""

    def __init__(self, model: LoadedModel, task):
        super().__init__()
        self.model, self.task, self.adapter = model.model, task, model
        self.members = [member.name for member in task.members]
        self.grouped = task.grouped
        self.generator = Generator(model, task.until, task.max_gen_toks)
        self.corpus = getattr(task, "corpus_metrics", None)
        self.metric_names = [] if self.corpus else task.metrics
        self.metrics = torch.nn.ModuleDict({
            f"{name}:{metric}": torchmetrics.MeanMetric() for name in self.members for metric in self.metric_names})
        self.records: list[dict] = []
        self.group_stderr: dict[str, float] = {}

    def test_step(self, batch: list[EncodedRequest], batch_idx: int) -> None:
        if batch[0].text is None:
            responses = self.generator([item.tokens for item in batch])
        else:
            images = [list(item.document.requests[0].images) for item in batch]
            responses = self.generator.generate(self.adapter.multimodal_inputs([i.text for i in batch], images))
        for item, response in zip(batch, responses):
            document = item.document
            record = self.task.process_results(document, [response])
            for metric in self.metric_names:
                self.metrics[f"{document.task}:{metric}"].update(record[metric])
            self.records.append(record)

    def on_test_epoch_end(self) -> None:
        if self.corpus:
            values, self.group_stderr = self.corpus(self.records)
            for metric, value in values.items():  # a member's `<member>/<metric>` as named (lm-eval groups)
                self.log(metric if "/" in metric else f"{self.task.name}/{metric}", value)
            return
        sizes = {name: sum(r["task"] == name for r in self.records) for name in self.members}
        for metric in self.metric_names:
            means, stderrs = [], []
            for name in self.members:
                mean = float(self.metrics[f"{name}:{metric}"].compute())
                stderr = mean_stderr([r[metric] for r in self.records if r["task"] == name])
                means.append(mean)
                stderrs.append(stderr)
                self.log(f"{name}/{metric}", mean)
                if self.grouped:
                    self.log(f"{name}/{metric}_stderr", stderr)
            if self.grouped:
                score, stderr = self.task.aggregate(means, stderrs, list(sizes.values()))
                self.log(f"{self.task.name}/{metric}", score)
                self.group_stderr[metric] = stderr

    def stderr(self, name: str) -> float:
        if self.corpus:
            return self.group_stderr.get(name, float("nan"))
        if self.grouped:
            return self.group_stderr[name]
        return mean_stderr([r[name] for r in self.records])


def evaluation(task, model: LoadedModel, limit: int | None, options) -> tuple[GenerationDataModule,
                                                                               GenerationModule]:
    data = GenerationDataModule(task, model, limit, batch_tokens=budget(options, model.device, scoring=False),
                                add_bos=options.add_bos)
    return data, GenerationModule(model, task)
