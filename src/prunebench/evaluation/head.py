"""Log-probabilities of chosen tokens without materialising the full logits: the LM head runs over
blocks of rows and of the vocabulary, and an online log-sum-exp carries each row's normaliser and
first argmax across the vocabulary blocks.

On a CPU a [rows, 262k] fp32 logits tensor is far larger than a core's cache, so the log-softmax,
the argmax and the fp32 upcast each stream it through memory once more than the matmul that made
it; a [256, 4096] block (4 MiB) stays in cache from the matmul to its reductions, which made the
head 2.7x faster on this project's 2-core build machine (gemma3-270m, bf16). A GPU gets the whole
vocabulary as one block: there bandwidth is plentiful and kernel launches are what costs.

Numerics: logits in the model's dtype, upcast to fp32, log-sum-exp in fp32 (as the fast scorer
always took its log-softmax); the greedy test is the first argmax of the logits themselves, where
lm-eval takes it of the fp32 log-softmax: the same token unless subtracting the normaliser rounds
two distinct fp32 logits to one value (never at bf16, whose logits are 2^-8 apart)."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel

# hidden rows per LM-head matmul, and vocabulary columns per block on a CPU: 256 rows keep the
# matmul at full speed, and 256 x 4096 fp32 logits (4 MiB) fit a core's cache
ROWS = 256
CPU_VOCAB_BLOCK = 4096


def token_logprobs(model: LoadedModel, hidden: torch.Tensor, targets: torch.Tensor,
                   entry_rows: torch.Tensor | None = None, rows: int = ROWS,
                   vocab_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [n, H]; entry i asks for token targets[i] at row entry_rows[i] (default: row i; a row
    several entries share runs the head once) -> (log p(target) fp32, target is the row's first
    argmax), each [len(targets)]."""
    vocab, device = model.vocab_size, hidden.device
    if entry_rows is None:
        entry_rows = torch.arange(len(targets), device=device)
    if vocab_block is None:
        vocab_block = vocab if device.type == "cuda" else CPU_VOCAB_BLOCK
    logprob = torch.empty(len(targets), device=device)
    greedy = torch.empty(len(targets), dtype=torch.bool, device=device)
    for start in range(0, len(hidden), rows):
        entries = ((entry_rows >= start) & (entry_rows < start + rows)).nonzero()[:, 0]
        logprob[entries], greedy[entries] = _chunk(model, hidden[start:start + rows], entry_rows[entries] - start,
                                                   targets[entries], vocab, vocab_block)
    return logprob, greedy


def _chunk(model: LoadedModel, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, vocab: int,
           block: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, device = len(hidden), hidden.device
    best = torch.full((n,), -torch.inf, device=device)  # running max logit per row
    total = torch.zeros(n, device=device)  # running sum of exp(logit - best)
    first = torch.zeros(n, dtype=torch.long, device=device)  # index of the row's first max
    target_logit = torch.empty(len(targets), device=device)
    for lo in range(0, vocab, block):
        logits = model.lm_logits(hidden, slice(lo, lo + block)).float()
        block_best, block_first = logits.max(-1)
        new_best = torch.maximum(best, block_best)
        total = total * torch.exp(best - new_best) + torch.exp(logits - new_best[:, None]).sum(-1)
        first = torch.where(block_best > best, block_first + lo, first)  # strictly: an earlier tie stays first
        best = new_best
        inside = ((targets >= lo) & (targets < lo + block)).nonzero()[:, 0]
        target_logit[inside] = logits[rows[inside], targets[inside] - lo]
    return target_logit - (best + total.log())[rows], first[rows] == targets
