"""What re-routing did during one task: how many experts each token ran in each MoE layer, and the
parameters a token therefore activated.

Only real tokens count: a pre-hook on the decoder reads, for each forward, what each position stands
for from the engines' side channel (models.counted: finished generation rows, unmasked right padding,
a shared context standing for one sequence per option) and else from the 2D attention mask."""

from __future__ import annotations

import torch
from torch import nn

from prunebench.models.counted import CountedTokens


def routed_block(model: nn.Module, router: nn.Module) -> nn.Module:
    """The MoE block whose `gate` is this router (its `experts` hold the routed experts only;
    Qwen2-MoE's shared expert sits beside them and runs for every token)."""
    return next(m for m in model.modules() if getattr(m, "gate", None) is router)


class RoutingTelemetry:
    def __init__(self, model: nn.Module, routers: dict[int, nn.Module], counted: CountedTokens):
        self.num_experts = {layer: r.num_experts for layer, r in routers.items()}
        self.native_k = {layer: r.top_k for layer, r in routers.items()}
        self.expert_params = {
            layer: sum(p.numel() for p in routed_block(model, r).experts.parameters()) // r.num_experts
            for layer, r in routers.items()}
        self.total_params = sum(p.numel() for p in model.parameters())
        self.shared_params = self.total_params - sum(
            n * self.expert_params[layer] for layer, n in self.num_experts.items())
        self.histograms: dict[int, torch.Tensor] = {}
        self.counted = counted
        self._counts: torch.Tensor | None = None
        model.get_decoder().register_forward_pre_hook(self._note_tokens, with_kwargs=True)

    def _note_tokens(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        batch, width = (ids if ids is not None else kwargs["inputs_embeds"]).shape[:2]
        device = next(module.parameters()).device
        self._counts = self.counted.of(batch, width, kwargs.get("attention_mask"), device)

    def reset(self) -> None:
        self.histograms = {}

    def record(self, layer: int, kept: torch.Tensor) -> None:
        """`kept`: experts used by each token of the flattened [batch x length] input of the layer."""
        counts = torch.zeros(self.num_experts[layer] + 1, dtype=torch.long, device=kept.device)
        counts.scatter_add_(0, kept.long(), self._counts.to(kept.device))
        self.histograms[layer] = self.histograms.get(layer, 0) + counts

    def per_layer(self) -> dict[int, tuple[float, list[int]]]:
        """Layer -> (mean experts per token, tokens by experts used: index i = i experts)."""
        out = {}
        for layer, hist in sorted(self.histograms.items()):
            counts = hist.cpu().tolist()
            tokens = sum(counts)
            out[layer] = (sum(i * c for i, c in enumerate(counts)) / tokens if tokens else float("nan"), counts)
        return out

    def metrics(self, task: str) -> dict[str, float]:
        layers = self.per_layer()
        if not layers:
            return {}
        means = {layer: mean for layer, (mean, _) in layers.items()}
        active = self.shared_params + sum(m * self.expert_params[layer] for layer, m in means.items())
        native = self.shared_params + sum(k * self.expert_params[layer] for layer, k in self.native_k.items())
        return {f"{task}/experts_per_token": sum(means.values()) / len(means),
                **{f"{task}/experts_per_token/layer_{layer}": m for layer, m in means.items()},
                f"{task}/active_params": active,
                f"{task}/active_params_frac": active / self.total_params,
                f"{task}/active_params_vs_topk": active / native}

    def artifacts(self, task: str) -> dict[str, object]:
        layers = self.per_layer()
        if not layers:
            return {}
        table = {"task": task, "tokens": sum(layers[min(layers)][1]),
                 "layers": {str(layer): {"num_experts": self.num_experts[layer], "native_k": self.native_k[layer],
                                         "experts_per_token": mean,
                                         "tokens_by_experts_used": {str(i): c for i, c in enumerate(counts) if i}}
                            for layer, (mean, counts) in layers.items()}}
        return {f"routing/{task}.json": table, f"routing/{task}.png": histogram_figure(task, layers)}


def histogram_figure(task: str, layers: dict[int, tuple[float, list[int]]]):
    """Share of tokens by experts used (columns), one row per MoE layer, labelled with its mean."""
    from matplotlib.figure import Figure

    n_experts = max(len(counts) for _, counts in layers.values()) - 1
    shares = torch.tensor([[c / max(1, sum(counts)) for c in counts[1:]] for _, counts in layers.values()])
    fig = Figure(figsize=(min(16.0, 2.5 + 0.35 * n_experts), 1.2 + 0.35 * len(layers)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(shares.numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(n_experts), [str(i + 1) for i in range(n_experts)])
    ax.set_yticks(range(len(layers)), [f"layer {layer} ({mean:.2f})" for layer, (mean, _) in layers.items()])
    ax.set(xlabel="experts used by a token", title=f"{task}: share of tokens")
    fig.colorbar(image, ax=ax)
    return fig
