"""REAP (Lasby et al., 2025, "REAP: Router-weighted Expert Activation Pruning"): whole routed
experts removed from every MoE layer, those whose router-weighted output is smallest on calibration
data. As the released code (CerebrasResearch/reap, observer.py and prune.py) computes it:

  reap_e = mean over the calibration tokens x routed to e of  g_e(x) * ||E_e(x)||_2

where "routed" is e among the token's top-k router logits, E_e(x) the expert's output before any
gate weight, and g_e(x) the softmax over all of the layer's experts in float32, divided by the sum of
the token's top-k probabilities only where the config sets `norm_topk_prob` (Qwen3-MoE's released
models; Mixtral has no such key, so it is scored with raw probabilities though it rescales them
itself). An expert no token reached scores 0. The same pass gives the release's other saliencies
(`score`): frequency (tokens routed to e), ean_sum / ean_mean (sum / mean of ||E_e(x)||),
weighted_ean_sum (sum of g * ||E_e(x)||), weighted_frequency_sum (sum of g).

Every MoE layer loses int(experts * sparsity) experts (the release's count), the lowest scores as
CPU torch.topk(largest=False) picks them (its tie order too). The router keeps the rows of the
experts left, so each token still routes top-k over them, and the config's expert count is
rewritten: the model saves and reloads as a stock one with fewer experts. Qwen2-MoE's shared expert
is no routed expert and stays. `reap_topp` then routes each token by top-p over the experts left
(moe_topp's routing, routing.py)."""

from __future__ import annotations

import torch
from torch import nn

from prunebench.models.introspection import count_parameters
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner
from prunebench.pruners.routing import ROUTERS, TopPRouting, moe_routers
from prunebench.pruners.routing_telemetry import routed_block
from prunebench.pruners.structured import calibration_batches, observe

# what each saliency reads of a layer's sums (observer.py's state keys, prune.py's names)
SCORES = ("reap", "frequency", "ean_sum", "ean_mean", "weighted_ean_sum", "weighted_frequency_sum")
# where each family's config states its routed expert count
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")


def expert_count_key(config) -> str:
    key = next((k for k in EXPERT_COUNT_KEYS if getattr(config, k, None)), None)
    if key is None:
        raise ValueError(f"the model's config states no routed expert count ({' / '.join(EXPERT_COUNT_KEYS)})")
    return key


def experts_removed(n_experts: int, sparsity: float) -> int:
    """prune.py's int(total_experts * compression_ratio): truncated, as the release does."""
    return int(n_experts * sparsity)


@torch.no_grad()
def routed_sums(model: nn.Module, batches: list[dict], renormalize: bool) -> dict[int, dict[str, torch.Tensor]]:
    """Per MoE layer (block index), per expert: tokens routed to it (`count`) and the sums over them
    of ||E_e(x)|| (`norm`), g_e(x) * ||E_e(x)|| (`weighted_norm`) and g_e(x) (`weight`).

    A hook on each router sees the layer's input and logits; each expert then runs, unweighted, on
    the tokens routed to it (the release runs every expert on every token and reads the routed ones:
    the same numbers at k/experts of the cost). Sums, not the release's running means: the means of
    the totals are what its weighted running means converge to, without their float32 rounding."""
    routers = moe_routers(model)
    sums, handles = {}, []

    def observer(layer: int, router: nn.Module):
        experts, n = routed_block(model, router).experts, router.num_experts
        sums[layer] = {"count": torch.zeros(n, dtype=torch.long),
                       **{key: torch.zeros(n, dtype=torch.float64) for key in ("norm", "weighted_norm", "weight")}}

        def hook(module, args, output):
            hidden = args[0].reshape(-1, args[0].shape[-1])
            logits = output[0]
            selected = torch.topk(logits, router.top_k, dim=-1).indices
            weights = torch.softmax(logits, dim=-1, dtype=torch.float)
            if renormalize:
                weights = weights / weights.gather(1, selected).sum(-1, keepdim=True)
                weights = weights.clamp(min=torch.finfo(weights.dtype).eps)
            for e in range(n):
                routed = (selected == e).any(-1)
                tokens = int(routed.sum())
                if not tokens:
                    continue
                index = torch.full((tokens, 1), e, dtype=selected.dtype, device=hidden.device)
                ones = torch.ones((tokens, 1), dtype=hidden.dtype, device=hidden.device)
                norms = experts(hidden[routed], index, ones).float().norm(dim=-1)
                gate = weights[routed, e]
                total = sums[layer]
                total["count"][e] += tokens
                total["norm"][e] += norms.sum().double().cpu()
                total["weighted_norm"][e] += (norms * gate).sum().double().cpu()
                total["weight"][e] += gate.sum().double().cpu()

        return hook

    try:
        for layer, router in routers.items():
            handles.append(router.register_forward_hook(observer(layer, router)))
        for batch in batches:
            observe(model, {**batch, "use_cache": False})
    finally:
        for handle in handles:
            handle.remove()
    return sums


def saliency(sums: dict[str, torch.Tensor], score: str) -> torch.Tensor:
    """One layer's score per expert, in the dtype the release's state holds it (its means float32)."""
    count = sums["count"]
    if score == "frequency":
        return count
    if score in ("reap", "ean_mean"):
        total = sums["weighted_norm" if score == "reap" else "norm"]
        return torch.where(count > 0, total / count.clamp(min=1), 0.0).float()
    return sums[{"ean_sum": "norm", "weighted_ean_sum": "weighted_norm", "weighted_frequency_sum": "weight"}[score]]


def remove_experts(model: nn.Module, router: nn.Module, keep: torch.Tensor) -> None:
    """Keeps the experts `keep` (ascending) of one MoE layer: their slices of every per-expert
    tensor of the experts module (weights, biases) and of the router (its rows, any bias or score
    correction), and the expert counts both modules route with."""
    n = router.num_experts
    for module in (router, routed_block(model, router).experts):
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.shape[:1] == (n,):
                tensor.data = tensor.data[keep.to(tensor.device)]
        module.num_experts = len(keep)


def full_config(config):
    """A transformers config with its defaults: a tiny model's dict states only what it changes."""
    if isinstance(config, dict):
        from transformers import AutoConfig

        return AutoConfig.for_model(**config)
    return config


class ReapPruner(Pruner):
    """`score`: reap (default) or another of the release's saliencies (SCORES).
    `renormalize_router_weights`: the release's flag (default true): rescale the top-k gate weights
    to sum 1 where the config sets norm_topk_prob. `batch_size`: calibration windows per forward
    (the release: 1; the sums do not depend on it)."""

    families = frozenset({"moe"})
    needs_calibration = True
    unscored = frozenset({"name", "score"})

    def __init__(self, name: str = "experts_reap", score: str = "reap", renormalize_router_weights: bool = True,
                 batch_size: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        if score not in SCORES:
            raise ValueError(f"pruner.score={score!r} is not one of {list(SCORES)}")
        self.score_name, self.renormalize, self.batch_size = score, renormalize_router_weights, batch_size

    def check_config(self, config, sparsity: float) -> None:
        config = full_config(config)
        if config is None:
            return
        if config.model_type not in ROUTERS:
            raise ValueError(f"expert pruning reaches the routers of {sorted(ROUTERS)}; this model is "
                             f"{config.model_type!r}")
        n = getattr(config, expert_count_key(config))
        top_k, left = config.num_experts_per_tok, n - experts_removed(n, sparsity)
        if left < top_k:
            raise ValueError(f"sparsity={sparsity} removes {n - left} of {n} experts per layer, leaving {left}, fewer "
                             f"than the {top_k} each token is routed to (num_experts_per_tok); the most it can "
                             f"remove is {n - top_k} (sparsity < {(n - top_k + 1) / n:g})")
        if n - left == 0:
            raise ValueError(f"sparsity={sparsity} removes int({n} x {sparsity}) = 0 of the {n} experts per layer; "
                             f"the least that removes one is sparsity={1 / n:g}")

    def keyed_sparsity(self, config, sparsity: float) -> float:
        """The fraction of experts removed, int(n x sparsity) / n: sparsity=0.8 of 8 experts removes the
        same 6 as 0.75, and is recorded (and keyed) as 0.75, so a sweep does not evaluate one model twice."""
        config = full_config(config)
        if config is None or config.model_type not in ROUTERS:
            return sparsity
        n = getattr(config, expert_count_key(config))
        return experts_removed(n, sparsity) / n

    def score(self, loaded: LoadedModel, calib=None) -> dict[int, dict[str, torch.Tensor]]:
        renormalize = self.renormalize and bool(getattr(loaded.model.config, "norm_topk_prob", False))
        return routed_sums(loaded.model, calibration_batches(loaded, calib, self.batch_size), renormalize)

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        """Not StructuredPruner's report: its FLOP count cannot trace the fused experts' kernels,
        and top-k routing over fewer experts leaves each token's FLOPs as they were (less the
        router's rows); the parameters removed are what expert pruning saves."""
        model, config = loaded.model, loaded.model.config
        params = count_parameters(model)
        key = expert_count_key(config)
        n = getattr(config, key)
        self.check_config(config, sparsity)
        drop = experts_removed(n, sparsity)
        for layer, router in moe_routers(model).items():
            removed = torch.topk(saliency(scores[layer], self.score_name), drop, largest=False).indices
            keep = torch.tensor(sorted(set(range(n)) - set(removed.tolist())), dtype=torch.long)
            remove_experts(model, router, keep)
        setattr(config, key, n - drop)
        return {"sparsity/actual": drop / n, "experts/per_layer": float(n - drop),
                "sparsity/params": 1 - count_parameters(model) / params}


class ReapTopP(ReapPruner):
    """REAP, then per-token top-p routing over the experts left (moe_topp: `threshold`,
    `renormalize`): fewer experts and fewer of them per token in one job. The routing is a forward
    hook, so there is no checkpoint that holds it: not exportable (export REAP alone with pruner=reap)."""

    exportable = False
    unscored = ReapPruner.unscored | {"threshold", "renormalize"}

    def __init__(self, name: str, threshold: float, renormalize: bool = False, **options):
        super().__init__(name, **options)
        self.routing = TopPRouting(name, threshold, renormalize)

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float | str]:
        return {**super().apply(loaded, scores, sparsity), **self.routing.apply(loaded, None, sparsity)}

    def start_task(self, task: str) -> None:
        self.routing.start_task(task)

    def task_metrics(self, task: str) -> dict[str, float]:
        return self.routing.task_metrics(task)

    def task_artifacts(self, task: str) -> dict[str, object]:
        return self.routing.task_artifacts(task)
