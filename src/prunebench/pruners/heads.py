"""Attention-head pruning: sparsity is the fraction of heads removed.

Scorers: HIS (Michel et al. 2019: |d loss / d gate| of a gate on each head's output), attention
entropy, HIES (Choi et al.: a * HIS_norm + (1 - a) * (1 - AE_norm)), and the L2 and random
baselines. Heads are ranked across all layers by default (`scope: layer` ranks within each) and
removed physically, so the pruned model is smaller and faster; `mode: mask` zeroes them instead."""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from functools import partial

import torch

from prunebench.models.attention import Heads, attention_heads, eager_attention, head_gates, sync_config
from prunebench.models.introspection import TOWERS
from prunebench.models.loaded import LoadedModel
from prunebench.api.seeds import torch_seed
from prunebench.pruners.base import tower_hint
from prunebench.pruners.structured import (StructuredPruner, calibration_batches, differentiable_only, model_loss,
                                          observe)

SCOPES = ("global", "layer")
MODES = ("remove", "mask")
NORMALIZE = ("layer", "none")
# batch: |d loss / d gate| per calibration batch (the gate's gradient sums the head's contribution
# over the batch's tokens before the absolute value; transformers' bertology port, and with batch_size
# 1 the HIES paper's E_x |A_h^T dL/dA_h|); token: Michel et al.'s calculate_head_importance,
# |A_h^T dL/dA_h| per token, summed, over the tokens (`dot.abs().sum(-1).sum(0)` / tot_tokens)
HIS_FORMS = ("batch", "token")


def normalised_entropy(probs: torch.Tensor, query_mask: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over queries, number of queries) per head of each query's attention entropy divided by
    log n, n = the keys it attends to (probability > 0: masked keys are exactly 0 after softmax).

    Queries that attend to one key (a causal model's first token) carry no information and are
    skipped, as are padding queries (`query_mask` 0)."""
    p = probs.detach().float()
    attended = (p > 0).sum(-1)
    valid = attended > 1
    if query_mask is not None:
        valid &= query_mask.bool()[:, None, :]
    entropy = torch.special.entr(p).sum(-1) / attended.clamp_min(2).log()
    return torch.where(valid, entropy, 0.0).sum((0, 2)), valid.sum((0, 2))


@contextmanager
def head_inputs(heads: list[Heads]):
    """The latest input of each layer's output projection (its heads' outputs side by side), kept
    per forward so the loss can be differentiated with respect to it."""
    seen: list[torch.Tensor | None] = [None] * len(heads)

    def keep(layer, module, args):
        seen[layer] = args[0]

    handles = [h.out_proj.register_forward_pre_hook(partial(keep, i)) for i, h in enumerate(heads)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def per_token_importance(heads: list[Heads], inputs: list[torch.Tensor], grads: list[torch.Tensor],
                         batch: dict) -> list[tuple[torch.Tensor, float]]:
    """Michel et al.'s sum over positions of |A_h . dL/dA_h| at each position, per head, with the
    tokens it is averaged over (the text's non-padding tokens, as their `tot_tokens`; every
    position of a tower whose queries are not the text)."""
    out = []
    for h, x, g in zip(heads, inputs, grads):
        dot = (x.detach().double() * g.double()).reshape(*x.shape[:-1], h.n_heads, h.head_dim).sum(-1)
        mask = batch.get("attention_mask") if h.reads_text else None
        tokens = float(mask.sum()) if mask is not None else dot.numel() / h.n_heads
        out.append((dot.abs().reshape(-1, h.n_heads).sum(0).cpu(), tokens))
    return out


def head_statistics(model: torch.nn.Module, batches: list[dict], his: bool = True, entropy: bool = True,
                    loss_fn=model_loss, tower: str = "language", his_form: str = "batch"
                    ) -> dict[str, list[torch.Tensor]]:
    """Per layer, per head of `tower`: `his` in `his_form` (HIS_FORMS: the mean over batches of
    |d loss / d gate|, or Michel et al.'s per-token form), `entropy` = mean normalised attention
    entropy; both from one pass over the calibration batches."""
    if his_form not in HIS_FORMS:
        raise ValueError(f"his_form={his_form!r}; valid: {HIS_FORMS}")
    heads = attention_heads(model, tower)
    # the per-token form adds one term per token and head: summed in float64, as Wanda's norms are
    his_sum = [torch.zeros(h.n_heads, dtype=torch.float64 if his_form == "token" else torch.float32) for h in heads]
    his_tokens = [0.0 for _ in heads]
    ent_sum = [torch.zeros(h.n_heads) for h in heads]
    ent_n = [torch.zeros(h.n_heads) for h in heads]
    current = {}

    def sink(layer: int, probs: torch.Tensor) -> None:
        # a vision tower's queries are image patches, which the text's padding mask does not describe
        mask = current.get("attention_mask") if heads[layer].reads_text else None
        total, count = normalised_entropy(probs, mask)
        ent_sum[layer] += total.cpu()
        ent_n[layer] += count.cpu()

    with ExitStack() as stack:
        stack.enter_context(differentiable_only(model))
        gates = stack.enter_context(head_gates(heads)) if his else None
        # registered after the gates, so they see the gated output, which carries the gradient
        inputs = stack.enter_context(head_inputs(heads)) if his and his_form == "token" else None
        if entropy:
            stack.enter_context(eager_attention(model, heads))
            for h in heads:
                stack.callback(h.probe(sink).remove)
        for batch in batches:
            current = batch
            if his:
                # a head whose output the loss never sees (LLaVA reads its vision tower's
                # second-to-last layer, so the last layer's heads) has importance 0
                loss = loss_fn(model, batch)
                if inputs is None:
                    grads = torch.autograd.grad(loss, gates, allow_unused=True, materialize_grads=True)
                    for acc, grad in zip(his_sum, grads):
                        acc += grad.detach().abs().cpu()
                else:
                    grads = torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)
                    for layer, (total, tokens) in enumerate(per_token_importance(heads, inputs, grads, batch)):
                        his_sum[layer] += total
                        his_tokens[layer] += tokens
            else:
                with torch.no_grad():
                    observe(model, batch)
    out = {}
    if his:
        out["his"] = ([s / len(batches) for s in his_sum] if his_form == "batch" else
                      [(s / max(n, 1.0)).float() for s, n in zip(his_sum, his_tokens)])
    if entropy:
        out["entropy"] = [s / n.clamp_min(1) for s, n in zip(ent_sum, ent_n)]
    return out


def min_max(per_layer: list[torch.Tensor]) -> list[torch.Tensor]:
    """Min-max normalisation over all heads of all layers (HIES's normalisation)."""
    flat = torch.cat(per_layer)
    low, span = flat.min(), (flat.max() - flat.min()).clamp_min(1e-12)
    return [(s - low) / span for s in per_layer]


def choose_pruned(importance: list[torch.Tensor], sparsity: float, scope: str = "global",
                  keep_one_per_layer: bool = False) -> list[set[int]]:
    """The least important floor(n_heads x sparsity) heads (stable on ties), counted over the
    model or within each layer; `keep_one_per_layer` spares each layer's last head."""
    count = lambda n: math.floor(n * sparsity + 1e-9)  # noqa: E731
    sizes = [len(s) for s in importance]
    floor = 1 if keep_one_per_layer else 0
    if scope == "layer":
        return [set(torch.argsort(s, stable=True)[: min(count(n), n - floor)].tolist())
                for s, n in zip(importance, sizes)]
    owners = [(layer, h) for layer, n in enumerate(sizes) for h in range(n)]
    pruned = [set() for _ in importance]
    budget = count(len(owners))
    for flat in torch.argsort(torch.cat(importance), stable=True).tolist():
        if budget == 0:
            break
        layer, h = owners[flat]
        if len(pruned[layer]) < sizes[layer] - floor:
            pruned[layer].add(h)
            budget -= 1
    return pruned


def prune_heads(model: torch.nn.Module, heads: list[Heads], pruned: list[set[int]], mode: str = "remove",
                tower: str = "language") -> None:
    for h, gone in zip(heads, pruned):
        h.remove(gone) if mode == "remove" else h.mask(gone)
    if mode == "remove":
        sync_config(model, heads, tower)


class HeadPruner(StructuredPruner):
    """Ranks heads by `importance(scores)` (higher = keep) and removes the lowest. On a
    vision-language model, `tower` picks the heads: the language model's, the vision tower's, or
    both (ranked together under scope=global, as one model's heads)."""

    families = frozenset({"causal_lm", "encoder", "vision", "vlm"})
    towers = frozenset(TOWERS)

    def __init__(self, name: str, scope: str = "global", keep_one_per_layer: bool = False,
                 mode: str = "remove", batch_size: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        if scope not in SCOPES or mode not in MODES:
            raise ValueError(f"pruner {name}: scope={scope!r} (valid: {SCOPES}), mode={mode!r} (valid: {MODES})"
                             + tower_hint(scope))
        self.scope, self.keep_one_per_layer, self.mode, self.batch_size = scope, keep_one_per_layer, mode, batch_size

    def importance(self, scores) -> list[torch.Tensor]:
        raise NotImplementedError

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        heads = attention_heads(loaded.model, self.tower)
        total = sum(h.n_heads for h in heads)
        pruned = choose_pruned(self.importance(scores), sparsity, self.scope, self.keep_one_per_layer)
        prune_heads(loaded.model, heads, pruned, self.mode, self.tower)
        return {"sparsity/actual": sum(map(len, pruned)) / total}


class CalibratedHeadPruner(HeadPruner):
    needs_calibration = True
    statistics: dict[str, bool]
    his_form = "batch"

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, list[torch.Tensor]]:
        batches = calibration_batches(loaded, calib, self.batch_size)
        return head_statistics(loaded.model, batches, **self.statistics, tower=self.tower, his_form=self.his_form)


class HISPruner(CalibratedHeadPruner):
    """`normalize: layer` divides each layer's HIS by the layer's L2 norm, as transformers'
    bertology script (the port of Michel et al.'s code) does by default: raw gradient magnitudes
    differ between layers, and ranked globally they can empty whole layers (on Gemma 3 270M at
    50%, four of 18 layers lost every head). `none` ranks the raw values. `his_form` (HIS_FORMS)
    picks where the absolute value is taken: per batch (default) or per token (Michel et al.'s
    code); on BERT the two rank heads alike, on causal LMs they do not (docs/structured.md)."""

    statistics = {"his": True, "entropy": False}

    def __init__(self, name: str = "heads_his", normalize: str = "layer", his_form: str = "batch", **kwargs):
        super().__init__(name, **kwargs)
        if normalize not in NORMALIZE or his_form not in HIS_FORMS:
            raise ValueError(f"pruner {name}: normalize={normalize!r} (valid: {NORMALIZE}), "
                             f"his_form={his_form!r} (valid: {HIS_FORMS})")
        self.normalize, self.his_form = normalize, his_form

    def his(self, scores) -> list[torch.Tensor]:
        if self.normalize == "layer":
            return [s / s.norm().clamp_min(1e-20) for s in scores["his"]]
        return scores["his"]

    def importance(self, scores):
        return self.his(scores)


class EntropyPruner(CalibratedHeadPruner):
    """Focused (low-entropy) heads are kept: importance = 1 - AE_norm (the paper's AD)."""

    statistics = {"his": False, "entropy": True}

    def importance(self, scores):
        return [1 - s for s in min_max(scores["entropy"])]


class HIESPruner(HISPruner):
    """alpha * HIS_norm + (1 - alpha) * (1 - AE_norm), HIS as `heads_his` computes it (including
    its `normalize`), both then min-max normalised over all heads."""

    statistics = {"his": True, "entropy": True}

    def __init__(self, name: str = "hies", alpha: float = 0.5, **kwargs):
        super().__init__(name, **kwargs)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"pruner {name}: alpha={alpha!r} must lie in [0, 1]")
        self.alpha = alpha

    def importance(self, scores):
        his, ent = min_max(self.his(scores)), min_max(scores["entropy"])
        return [self.alpha * h + (1 - self.alpha) * (1 - e) for h, e in zip(his, ent)]


class L2HeadPruner(HeadPruner):
    cacheable = False  # reading the weights is cheaper than the cache

    def score(self, loaded: LoadedModel, calib=None):
        return [h.weight_norms() for h in attention_heads(loaded.model, self.tower)]

    def importance(self, scores):
        return scores


class RandomHeadPruner(HeadPruner):
    cacheable = False

    def __init__(self, name: str = "heads_random", seed: int = 0, **kwargs):
        super().__init__(name, **kwargs)
        self.seed = torch_seed(f"pruner {name}", seed)

    def score(self, loaded: LoadedModel, calib=None):
        generator = torch.Generator().manual_seed(self.seed)
        return [torch.rand(h.n_heads, generator=generator) for h in attention_heads(loaded.model, self.tower)]

    def importance(self, scores):
        return scores
