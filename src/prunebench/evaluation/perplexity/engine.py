"""The `loglikelihood_rolling` engine: a text cut into consecutive token windows (windows.py), each
window's summed NLL, the task's process_results per window, and token-level perplexity in
Trainer.test."""

from __future__ import annotations

import math

import lightning as L
import torch
import torchmetrics

from prunebench.api.metrics import mean_stderr
from prunebench.api.requests import Document
from prunebench.evaluation.batching import budget
from prunebench.evaluation.head import token_logprobs
from prunebench.evaluation.perplexity.windows import TokenWindowDataModule
from prunebench.models.loaded import LoadedModel


class TokenPerplexity(torchmetrics.Metric):
    """exp(summed token NLL / predicted tokens); torchmetrics' Perplexity wants the full logits tensor
    and takes log(softmax), which underflows on the tokens a pruned model finds unlikely."""

    higher_is_better = False
    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("nll", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: torch.Tensor, tokens: torch.Tensor) -> None:
        self.nll += nll.sum().double()
        self.tokens += tokens.sum()

    def compute(self) -> torch.Tensor:
        return torch.exp(self.nll / self.tokens)


@torch.inference_mode()
def window_nll(model: LoadedModel, windows: torch.Tensor) -> torch.Tensor:
    """Summed NLL of positions 1.. of each window given the positions before it (the LM head
    blocked, head.token_logprobs: a whole window's logits would take 2 GB at Gemma's vocabulary)."""
    hidden = model.decoder()(input_ids=windows, use_cache=False).last_hidden_state[:, :-1]
    targets = windows[:, 1:]
    return torch.stack([-token_logprobs(model, hidden[row], targets[row])[0].double().sum()
                        for row in range(len(windows))])


class PerplexityModule(L.LightningModule):
    """Each window is a document of the rolling request: process_results makes its record."""

    def __init__(self, model: LoadedModel, task):
        super().__init__()
        self.model, self.adapter, self.task = model.model, model, task
        self.ppl = TokenPerplexity()
        self.records: list[dict] = []

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        nll = window_nll(self.adapter, batch)
        count = batch.shape[1] - 1
        self.ppl.update(nll, torch.full_like(nll, count, dtype=torch.long))
        for value in nll.tolist():
            self.records.append(self.task.process_results(Document(len(self.records), []), [(value, count)]))
        self.log(f"{self.task.name}/ppl", self.ppl, on_step=False, on_epoch=True, batch_size=len(batch))

    def stderr(self, name: str) -> float:
        """Delta method over windows: ppl x the standard error of the per-window mean NLL (the
        metric object is reset when the test epoch ends, so this reads the records)."""
        se = mean_stderr([r["nll"] / r["tokens"] for r in self.records])
        ppl = math.exp(sum(r["nll"] for r in self.records) / sum(r["tokens"] for r in self.records))
        return ppl * se


def window_length(seq_len: int | None, max_length: int) -> int:
    """The request's window length capped at the model's context; null = that context."""
    return min(seq_len, max_length) if seq_len else max_length


def evaluation(task, model: LoadedModel, limit: int | None, options) -> tuple[TokenWindowDataModule,
                                                                               PerplexityModule]:
    """`limit` counts windows, on top of the request's own cap."""
    model.check_lm_head()
    (request,) = task.instances()[0].requests
    caps = [c for c in (request.max_windows, limit) if c]
    data = TokenWindowDataModule(request.text, model.tokenizer, window_length(request.seq_len, model.max_length),
                                 limit=min(caps) if caps else None,
                                 batch_tokens=budget(options, model.device, scoring=True),
                                 add_bos=options.add_bos)
    return data, PerplexityModule(model, task)
