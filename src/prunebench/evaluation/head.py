"""Log-probabilities of chosen tokens without materialising the full logits: the LM head runs over
blocks of rows and of the vocabulary, and an online log-sum-exp carries each row's normaliser and
max across the vocabulary blocks.

On a CPU a [rows, 262k] fp32 logits tensor is far larger than a core's cache, so the log-softmax,
the argmax and the fp32 upcast each stream it through memory once more than the matmul that made
it; a [1024, 1024] block (4 MiB) stays in cache from the matmul to its reductions, and 1024 rows
read the head's weights once per 1024 positions (docs/commonsense.md has the measurement). A GPU
gets the whole vocabulary as one block: there bandwidth is plentiful and kernel launches are what
costs; its rows are then capped by the logits' bytes.

Numerics: logits in the model's dtype, upcast to fp32, log-sum-exp in fp32 (as the fast scorer
always took its log-softmax); the greedy test is the first argmax of the logits themselves, where
lm-eval takes it of the fp32 log-softmax: the same token unless subtracting the normaliser rounds
two distinct fp32 logits to one value (never at bf16, whose logits are 2^-8 apart)."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel

# on a CPU: hidden rows per LM-head matmul and vocabulary columns per block (the fastest measured
# shape, docs/commonsense.md); on a GPU: fp32 logits held at once
CPU_ROWS, CPU_VOCAB_BLOCK = 1024, 1024
GPU_LOGITS_BYTES = 256 * 2**20


def token_logprobs(model: LoadedModel, hidden: torch.Tensor, targets: torch.Tensor,
                   entry_rows: torch.Tensor | None = None, rows: int | None = None,
                   vocab_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [n, H]; entry i asks for token targets[i] at row entry_rows[i] (default: row i; a row
    several entries share runs the head once) -> (log p(target) fp32, target is the row's first
    argmax), each [len(targets)]."""
    vocab, device = model.vocab_size, hidden.device
    if entry_rows is None:
        entry_rows = torch.arange(len(targets), device=device)
    if device.type == "cuda":
        rows, vocab_block = rows or max(1, GPU_LOGITS_BYTES // (4 * vocab)), vocab_block or vocab
    else:
        rows, vocab_block = rows or CPU_ROWS, vocab_block or CPU_VOCAB_BLOCK
    logprob = torch.empty(len(targets), device=device)
    greedy = torch.empty(len(targets), dtype=torch.bool, device=device)
    for start in range(0, len(hidden), rows):
        entries = ((entry_rows >= start) & (entry_rows < start + rows)).nonzero()[:, 0]
        logprob[entries], greedy[entries] = _chunk(model, hidden[start:start + rows], entry_rows[entries] - start,
                                                   targets[entries], vocab, vocab_block)
    return logprob, greedy


def _chunk(model: LoadedModel, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, vocab: int,
           block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the vocabulary. A target is the row's first argmax when its logit is the row's
    max, no earlier block reached it and no earlier token of its own block equals it: so only the
    row max is tracked (amax, a third of max-with-index's cost on a CPU), and each block is reduced
    in place. One block (a GPU's) asks its argmax instead, which needs no [entries, vocab] mask."""
    n, device = len(hidden), hidden.device
    best = torch.full((n,), -torch.inf, device=device)  # running max logit per row
    total = torch.zeros(n, device=device)  # running sum of exp(logit - best)
    target_logit = torch.empty(len(targets), device=device)
    first = torch.empty(len(targets), dtype=torch.bool, device=device)  # no earlier token reached it
    order = targets.argsort()
    edges = torch.searchsorted(targets[order], torch.arange(0, vocab + block, block, device=device)).tolist()
    for b, lo in enumerate(range(0, vocab, block)):
        logits = model.lm_logits(hidden, slice(lo, lo + block)).float()
        if edges[b + 1] > edges[b]:  # the entries whose target lies in this block
            entries = order[edges[b]:edges[b + 1]]
            at, col = rows[entries], targets[entries] - lo
            value = logits[at, col]
            target_logit[entries] = value
            if block >= vocab:
                first[entries] = logits.argmax(-1)[at] == col
            else:
                before = torch.arange(logits.shape[1], device=device)[None, :] < col[:, None]
                first[entries] = (best[at] < value) & ~((logits[at] == value[:, None]) & before).any(-1)
        new_best = torch.maximum(best, logits.amax(-1))
        shift = torch.where(torch.isfinite(new_best), new_best, 0.0)  # a row all -inf so far sums to 0
        total = total * torch.exp(best - shift) + logits.sub_(shift[:, None]).exp_().sum(-1)
        best = new_best
    return target_logit - (best + total.log())[rows], first & (target_logit >= best[rows])
