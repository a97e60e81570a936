"""Dynamic expert routing for Hugging Face MoE models ("Harder Tasks Need More Experts", Huang et al.):
`moe_topp` keeps, per token, the most probable experts until their probability first exceeds a
threshold; `moe_topk` keeps a fixed k other than the model's own.

No weight is removed: the pruned quantity is the experts each token runs (see routing_telemetry).
The models were trained with top-k routing, so top-p here is the paper's inference-time ablation,
not its top-p-trained model; runs are tagged so.

In transformers 5 the routers of Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE share one contract,
`gate(hidden [tokens, H]) -> (logits, weights [tokens, k], experts [tokens, k])`, read by the
block's experts module. A forward hook on each router re-selects from the logits it returned, so
the model's own code (and its choice of experts kernel) runs unchanged. A token that keeps fewer
experts than the widest token of its batch is padded with its top expert at weight 0: exact under
every experts kernel (eager, grouped_mm, batched_mm), at the cost of computing the padding, so wall
time does not show the saving."""

from __future__ import annotations

import torch
from hydra.utils import get_class
from torch import nn

from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner
from prunebench.pruners.routing_telemetry import RoutingTelemetry

# model_type -> router class; all four return (logits, weights, experts) from softmax probabilities
ROUTERS = {
    "mixtral": "transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter",
    "qwen2_moe": "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter",
    "qwen3_moe": "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter",
    "olmoe": "transformers.models.olmoe.modeling_olmoe.OlmoeTopKRouter",
}

Routing = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # weights [T, m], experts [T, m], kept [T]


def top_p_routing(probs: torch.Tensor, threshold: float, renormalize: bool = False) -> Routing:
    """Sorted descending, an expert is kept while the probability before it is <= threshold, which
    keeps the expert whose running sum first exceeds it (and everything when none does)."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1)[:, :-1]
    keep = torch.cat([torch.ones_like(sorted_p[:, :1], dtype=torch.bool), before <= threshold], dim=-1)
    kept = keep.sum(-1)
    width = int(kept.max()) if len(kept) else 1
    keep, sorted_p, order = keep[:, :width], sorted_p[:, :width], order[:, :width]
    weights = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    experts = torch.where(keep, order, order[:, :1])
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts, kept


def top_k_routing(probs: torch.Tensor, k: int, renormalize: bool) -> Routing:
    """The native routers' own computation with another k."""
    weights, experts = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return weights, experts, torch.full(weights.shape[:1], k, device=weights.device)


def moe_routers(model: nn.Module) -> dict[int, nn.Module]:
    """Block index -> router of that block's MoE layer (blocks with a dense MLP are absent)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ROUTERS:
        raise ValueError(f"routing pruners support the MoE model types {sorted(ROUTERS)}; this model is "
                         f"{model_type!r} ({type(model).__name__})")
    router_cls = get_class(ROUTERS[model_type])
    _, blocks = transformer_blocks(model)
    routers = {}
    for idx, block in enumerate(blocks):
        found = [m for m in block.modules() if isinstance(m, router_cls)]
        if len(found) > 1:
            raise ValueError(f"block {idx} of {type(model).__name__} has {len(found)} routers; expected one")
        if found:
            routers[idx] = found[0]
    if not routers:
        raise ValueError(f"no {router_cls.__name__} found in {type(model).__name__}")
    return routers


class RoutingPruner(Pruner):
    """Re-routes every MoE layer with `route` and counts the experts each token used, per task."""

    families = frozenset({"moe"})
    cacheable = False
    exportable = False  # a forward hook re-selects experts; no weight changes

    def __init__(self, name: str, renormalize: bool | None = None):
        super().__init__(name)
        self.renormalize = renormalize
        self.telemetry: RoutingTelemetry | None = None

    def route(self, probs: torch.Tensor, native_renormalize: bool) -> Routing:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def check_model(self, router: nn.Module) -> None:
        """Raise ValueError if this routing cannot apply to a router of the loaded model."""

    def apply(self, loaded: LoadedModel, scores, sparsity: float) -> dict:
        routers = moe_routers(loaded.model)
        for router in routers.values():
            self.check_model(router)
        self.telemetry = RoutingTelemetry(loaded.model, routers, loaded.counted)
        for layer, router in routers.items():
            router.register_forward_hook(self._rerouter(layer, router))
        native_k = next(iter(routers.values())).top_k
        return {"routing/native_k": float(native_k),
                "prunebench.routing": f"{self.describe()} at inference on a model trained with "
                                      f"top-{native_k} routing (an ablation of trained dynamic routing)"}

    def _rerouter(self, layer: int, router: nn.Module):
        # Mixtral always renormalises its top-k weights; the others follow config.norm_topk_prob
        native_renormalize = getattr(router, "norm_topk_prob", True)

        def hook(module, args, output):
            logits, native_weights, _ = output
            weights, experts, kept = self.route(torch.softmax(logits.float(), dim=-1), native_renormalize)
            self.telemetry.record(layer, kept)
            return logits, weights.to(native_weights.dtype), experts

        return hook

    def start_task(self, task: str) -> None:
        if self.telemetry:
            self.telemetry.reset()

    def task_metrics(self, task: str) -> dict[str, float]:
        return self.telemetry.metrics(task) if self.telemetry else {}

    def task_artifacts(self, task: str) -> dict[str, object]:
        return self.telemetry.artifacts(task) if self.telemetry else {}


class TopPRouting(RoutingPruner):
    """`threshold` p in [0, 1]; raw probabilities as weights unless `renormalize` (the paper: raw)."""

    def __init__(self, name: str, threshold: float, renormalize: bool = False):
        super().__init__(name, renormalize)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"pruner.threshold={threshold!r} must be a probability in [0, 1] (the paper: 0.4)")
        self.threshold = float(threshold)

    def route(self, probs: torch.Tensor, native_renormalize: bool) -> Routing:
        return top_p_routing(probs, self.threshold, self.renormalize)

    def describe(self) -> str:
        return f"top-p routing with p={self.threshold:g}"


class TopKRouting(RoutingPruner):
    """`k` experts per token in place of the native k; `renormalize` null keeps the model's rule."""

    def __init__(self, name: str, k: int, renormalize: bool | None = None):
        super().__init__(name, renormalize)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"pruner.k={k!r} must be a positive integer (experts per token)")
        self.k = k

    def check_model(self, router: nn.Module) -> None:
        if self.k > router.num_experts:
            raise ValueError(f"pruner.k={self.k} exceeds the model's {router.num_experts} experts per layer")

    def route(self, probs: torch.Tensor, native_renormalize: bool) -> Routing:
        renormalize = native_renormalize if self.renormalize is None else self.renormalize
        return top_k_routing(probs, self.k, renormalize)

    def describe(self) -> str:
        return f"top-{self.k} routing"
