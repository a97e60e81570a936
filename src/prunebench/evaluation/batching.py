"""How the text engines batch: whole documents packed under a token budget, sequences left-padded,
requests with images refused."""

from __future__ import annotations

from typing import Sequence

import torch

# eval.batch_tokens=null: each engine's own budget, DEFAULT_TOKENS unless SCORING_TOKENS names the
# device. A generation step reads every weight once for all its rows, so more rows are nearly free
# and it keeps 8192 positions everywhere. A scoring batch (log-likelihoods, perplexity windows) runs
# each position once; on a CPU 2048 positions score as fast as 8192 (gemma3-270m, ARC-Easy and
# HellaSwag, fp32 and bf16, docs/cluster.md#memory) and their activations, a dense fp32 job's largest
# cost beyond its weights and libraries, are a quarter
DEFAULT_TOKENS = 8192
SCORING_TOKENS = {"cpu": 2048}


def budget(options, device: torch.device, scoring: bool) -> int:
    """The padded positions one batch may run: eval.batch_tokens when set, else the engine's own."""
    if options.batch_tokens is not None:
        return options.batch_tokens
    return SCORING_TOKENS.get(device.type, DEFAULT_TOKENS) if scoring else DEFAULT_TOKENS


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


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, longest], attention mask): each sequence ends at the last column, so the next
    position of every row is the same one (generation, a KV cache extended by suffixes)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq):] = 1
    return ids, mask


def right_pad(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """ids [n, longest], padded with 0 after each sequence: for causal forwards whose padding only
    follows the real tokens, so no row's real token ever attends to it."""
    ids = torch.zeros((len(seqs), max(len(s) for s in seqs)), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids


def refuse_images(task, document) -> None:
    """A text engine would score an image request as if it had no image: better to say so."""
    if any(getattr(request, "images", ()) for request in document.requests):
        raise ValueError(f"task {task.name}, document {document.doc_id}: its requests carry images, which the "
                         f"{task.kind} engine for text models does not feed to the model")
