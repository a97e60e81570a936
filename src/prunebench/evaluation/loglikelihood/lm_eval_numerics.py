"""Continuation log-likelihoods computed as lm-eval 0.4.13's HFLM computes them (`eval.numerics=lm_eval`),
so that a bf16 model gives lm-eval's numbers and not only fp32-close ones.

What HFLM._loglikelihood_tokens does, and so what this does, op for op: every distinct fed sequence
(context + continuation[:-1]; choices sharing one, such as one-token continuations after the same
context, run once, as its Collator groups them) is one row; the rows of the whole task are sorted
longest first, then by their tokens, cut into batches of `batch_size` rows, right-padded to the
longest row of their batch and run through the model's own forward with no attention mask (causal:
right padding is never attended); the full [rows, length, vocab] logits come back in the model's
dtype, log-softmax runs over them in that dtype (HFLM's `softmax_dtype=None`), the continuation
tokens' log-probabilities are gathered and summed in that dtype, and the sum becomes a Python float.

Why all of it: in bf16 a choice's log-likelihood is rounded to 8 significant bits, so choices often
tie (the first wins), and matmul and attention kernels round a row differently in batches of a
different shape, by as much as a few tenths of a nat per choice on gemma3-270m. So only the same
rows in the same batches give lm-eval's numbers; its own batch sizes disagree with each other
(scripts/mc_throughput.py measures by how much). With the same batch_size, on the same hardware and
kernels, the numbers are lm-eval's bit for bit (tests/tasks/test_lm_eval_conformance.py)."""

from __future__ import annotations

from typing import Sequence

import torch

from prunebench.evaluation.batching import right_pad
from prunebench.models.loaded import LoadedModel


@torch.inference_mode()
def score_documents_lm_eval(model: LoadedModel, docs: Sequence, batch_size: int) -> list[list[tuple[float, bool]]]:
    """Per document, per choice: (sum log p(continuation), continuation is the greedy decode)."""
    device, hf = model.device, model.model
    requests: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for d, doc in enumerate(docs):
        for c, seq in enumerate(doc.inputs):
            requests.setdefault(tuple(seq), []).append((d, c))
    # HFLM's Collator key: -len(context + continuation), then those tokens; one row per fed sequence
    order = sorted(requests, key=lambda seq: (-len(seq), seq))
    out = [[None] * len(doc.inputs) for doc in docs]
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        logprobs = torch.log_softmax(hf(right_pad(batch).to(device)).logits, dim=-1)
        for row, seq in enumerate(batch):
            for d, c in requests[seq]:
                clen = docs[d].cont_lens[c]
                picked = logprobs[row, len(seq) - clen: len(seq)][None]
                targets = torch.tensor(docs[d].conts[c], dtype=torch.long, device=device)[None]
                greedy = bool((picked.argmax(-1) == targets).all())
                out[d][c] = (float(torch.gather(picked, 2, targets[..., None]).squeeze(-1).sum()), greedy)
    return out
