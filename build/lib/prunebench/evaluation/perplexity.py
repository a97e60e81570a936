"""Token-level perplexity of a causal LM over token windows, in Trainer.test."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics

from prunebench.evaluation.loglik import lm_head_logits

# logits held at once: with Gemma's 262k vocabulary a whole 2048-token window would take 2 GB
LOGIT_BUDGET = 1 << 26


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
def window_nll(model, windows: torch.Tensor) -> torch.Tensor:
    """Summed NLL of positions 1.. of each window given the positions before it; the LM head runs
    on a few positions at a time."""
    hidden = model.get_decoder()(input_ids=windows, use_cache=False).last_hidden_state[:, :-1]
    targets = windows[:, 1:]
    step = max(1, LOGIT_BUDGET // model.get_output_embeddings().weight.shape[0])
    out = torch.zeros(len(windows), dtype=torch.float64, device=windows.device)
    for row in range(len(windows)):
        for start in range(0, targets.shape[1], step):
            logits = lm_head_logits(model, hidden[row, start:start + step]).float()
            out[row] += F.cross_entropy(logits, targets[row, start:start + step], reduction="sum").double()
    return out


class PerplexityModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task_name: str):
        super().__init__()
        self.model = model
        self.task_name = task_name
        self.ppl = TokenPerplexity()
        self.records: list[dict] = []

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        nll = window_nll(self.model, batch)
        count = batch.shape[1] - 1
        self.ppl.update(nll, torch.full_like(nll, count, dtype=torch.long))
        for value in nll.tolist():
            self.records.append({"window": len(self.records), "tokens": count, "nll": value,
                                 "ppl": math.exp(value / count)})
        self.log(f"{self.task_name}/ppl", self.ppl, on_step=False, on_epoch=True, batch_size=len(batch))

    def stderr(self, name: str) -> float:
        """Delta method over windows: ppl x the standard error of the per-window mean NLL (the
        metric object is reset when the test epoch ends, so this reads the records)."""
        means = [r["nll"] / r["tokens"] for r in self.records]
        n = len(means)
        if n < 2:
            return float("nan")
        mean = sum(means) / n
        se = math.sqrt(sum((m - mean) ** 2 for m in means) / (n - 1) / n)
        ppl = math.exp(sum(r["nll"] for r in self.records) / sum(r["tokens"] for r in self.records))
        return ppl * se
