"""LLM-Pruner without recovery (Ma et al., NeurIPS 2023; github.com/horseee/LLM-Pruner, its
block-wise mode, the "w/o tune" rows of its tables: no LoRA fine-tuning follows).

Coupled structures: an attention head with its query, key and value rows and its output-projection
columns; an MLP neuron with its gate and up rows and its down-projection column. Each is scored by
the first-order Taylor term of the loss change when its weights are removed, |w * dL/dw| summed
over its weights (or the release's other levels), from the gradient of the LM loss on a few
calibration windows, and the lowest go: the same ratio in every layer of a range that leaves the
first and last layers whole. Under grouped-query attention the unit is a key/value head with the
query heads that read it, as the release's Llama-3 script prunes it (docs/structured.md)."""

from __future__ import annotations

import math
import torch
from torch import nn

from prunebench.models.attention import Heads, attention_heads, sync_config
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import config_value
from prunebench.models.narrow import IN_PROJS, keep_neurons
from prunebench.pruners.structured import StructuredPruner, calibration_batches, differentiable_only, model_loss
from prunebench.pruners.width import mlp_modules, sync_intermediate

# the release's `--taylor`: element-wise first order (the README's command), vector-wise first order,
# element-wise second order (diagonal Fisher: mean squared per-sample gradient), and first - 0.5 second
TAYLOR = ("param_first", "vectorize", "param_second", "param_mix")
# the release's `--grouping_strategy` (TaylorImportance._reduce) over a group's coupled layers;
# `first` is the group's root (query rows, key rows under grouped-query attention, gate rows)
REDUCTIONS = ("sum", "mean", "max", "prod", "first")
# how the release's layer indices (written for 32-layer LLaMA-7B) apply to a model of another depth
LAYER_RANGES = ("fraction", "index")


def layer_span(start: int, end: int, reference: int, layers: int, mapping: str) -> range:
    """`index`: the indices as given, clipped to the model; `fraction`: the same fractions of its depth
    (rounded half up), so a 30-layer model keeps its first 4 and last 2 layers whole as LLaMA-7B does."""
    if mapping == "index":
        return range(min(start, layers), min(end, layers))
    return range(*(math.floor(i * layers / reference + 0.5) for i in (start, end)))


def pruned_count(channels: int, ratio: float) -> int:
    """MetaPruner's local step: channels - int(channels * (1 - ratio)), floats as they fall."""
    return channels - int(channels * (1 - ratio))


def taylor_gradients(model: nn.Module, batches: list[dict], params: list[nn.Parameter], second: bool
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """(gradient of the mean loss over the calibration windows, mean squared per-window gradient or None).

    The release backpropagates its 10 windows as one batch (the gradient of their mean loss) and,
    for the second-order levels, each window alone into `acc_grad`. One window at a time, the loss
    scaled by 1/N, gives the same sums (the windows have equal length) from one window's activations,
    and both statistics from the same backward passes. Sums are kept in float32."""
    grads = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    squares = [torch.zeros_like(p, dtype=torch.float32) for p in params] if second else None
    with differentiable_only(model, params):
        for batch in batches:
            rows = len(next(iter(batch.values())))
            if rows != 1:
                raise ValueError(f"llm_pruner differentiates one calibration window at a time; got a batch of {rows}")
            loss = model_loss(model, batch)
            for i, g in enumerate(torch.autograd.grad(loss, params)):
                g = g.float()
                grads[i].add_(g, alpha=1 / len(batches))
                if second:
                    squares[i].addcmul_(g, g, value=1 / len(batches))
    return grads, squares


def salience(weight: torch.Tensor, grad: torch.Tensor, square: torch.Tensor | None, taylor: str) -> torch.Tensor:
    w = weight.detach().float()
    if taylor == "param_second":
        return w * square * w
    first = w * grad
    return first - 0.5 * w * square * w if taylor == "param_mix" else first


def channel_scores(s: torch.Tensor, axis: int, taylor: str) -> torch.Tensor:
    """One score per channel: rows (a layer's outputs, axis=1 summed) or columns (its inputs, axis=0).
    `vectorize` takes |sum| over the channel's weights, the element levels the sum of |.|."""
    return s.sum(axis).abs() if taylor == "vectorize" else s.abs().sum(axis)


def reduce(stacked: torch.Tensor, how: str) -> torch.Tensor:
    if how == "sum":
        return stacked.sum(0)
    if how == "mean":
        return stacked.mean(0)
    if how == "max":
        return stacked.max(0).values
    if how == "prod":
        return stacked.prod(0)
    return stacked[0]


def head_scores(h: Heads, per_weight, taylor: str, how: str) -> torch.Tensor:
    """One score per pruning unit: a head, or under grouped-query attention a key/value head and
    the query heads transformers' repeat_kv gives it (consecutive ones). Each projection's channel
    scores are brought to the key/value width (a group's query channels summed, position by position
    within the head), reduced over the projections, then summed over each head's channels."""
    q, k, v = h.qkv_linears()
    grouped = h.n_kv_heads < h.n_heads
    rows = {name: channel_scores(per_weight(linear), 1, taylor) for name, linear in (("q", q), ("k", k), ("v", v))}
    columns = channel_scores(per_weight(h.out_proj), 0, taylor)
    if not grouped:
        vectors = [rows["q"], rows["k"], rows["v"], columns]
    else:
        fold = lambda x: x.reshape(h.n_kv_heads, -1, h.head_dim).sum(1).flatten()  # noqa: E731
        vectors = [rows["k"], rows["v"], fold(rows["q"]), fold(columns)]
    return reduce(torch.stack(vectors), how).reshape(-1, h.head_dim).sum(1)


def neuron_scores(mlp: nn.Module, per_weight, taylor: str, how: str) -> torch.Tensor:
    rows = [channel_scores(per_weight(getattr(mlp, name)), 1, taylor) for name in IN_PROJS
            if isinstance(getattr(mlp, name, None), nn.Linear)]
    return reduce(torch.stack([*rows, channel_scores(per_weight(mlp.down_proj), 0, taylor)]), how)


def query_heads(h: Heads, units: list[int]) -> set[int]:
    """The query heads of the pruned units (a unit is a head, or a key/value head's group)."""
    size = h.n_heads // h.n_kv_heads if h.n_kv_heads < h.n_heads else 1
    return {unit * size + i for unit in units for i in range(size)}


class LLMPruner(StructuredPruner):
    """`llm_pruner`: sparsity = the release's `pruning_ratio`, the fraction of the heads (key/value
    groups under grouped-query attention) and MLP neurons removed in every layer of the pruned range;
    the layers outside it stay whole. `sparsity/actual` is the neurons' achieved fraction in that
    range, `sparsity/heads` the fraction of the model's query heads removed."""

    families = frozenset({"causal_lm"})
    needs_calibration = True
    onload_refusal = "its Taylor scores come from one backward pass through the whole model at once"

    def __init__(self, name: str = "llm_pruner", taylor: str = "param_first", group_reduction: str = "sum",
                 attention_layer_start: int = 4, attention_layer_end: int = 30, mlp_layer_start: int = 4,
                 mlp_layer_end: int = 30, reference_layers: int = 32, layer_range: str = "fraction",
                 tower: str = "language"):
        super().__init__(name, tower)
        if taylor not in TAYLOR or group_reduction not in REDUCTIONS or layer_range not in LAYER_RANGES:
            raise ValueError(f"pruner {name}: taylor={taylor!r} (valid: {TAYLOR}), group_reduction="
                             f"{group_reduction!r} (valid: {REDUCTIONS}), layer_range={layer_range!r} "
                             f"(valid: {LAYER_RANGES})")
        bounds = (attention_layer_start, attention_layer_end, mlp_layer_start, mlp_layer_end)
        if reference_layers < 1 or min(bounds) < 0 or attention_layer_start > attention_layer_end \
                or mlp_layer_start > mlp_layer_end:
            raise ValueError(f"pruner {name}: layer ranges [{attention_layer_start}, {attention_layer_end}) and "
                             f"[{mlp_layer_start}, {mlp_layer_end}) must be 0 <= start <= end, reference_layers >= 1")
        self.taylor, self.group_reduction, self.layer_range = taylor, group_reduction, layer_range
        self.attention_layers = (attention_layer_start, attention_layer_end)
        self.mlp_layers = (mlp_layer_start, mlp_layer_end)
        self.reference_layers = reference_layers

    def check_config(self, config, sparsity: float) -> None:
        """A layer range that leaves no layer of this model to prune (the release's indices, 4..30, on
        a shallower model) is refused before the model loads; torch's own error came after scoring began."""
        layers = config_value(config, "num_hidden_layers")
        if not layers:
            return
        attention, mlp = self.spans(layers)
        if not attention and not mlp:
            raise ValueError(f"pruner.layer_range={self.layer_range}: attention layers "
                             f"[{self.attention_layers[0]}, {self.attention_layers[1]}) and MLP layers "
                             f"[{self.mlp_layers[0]}, {self.mlp_layers[1]}) leave none of the model's {layers} layers "
                             f"to prune; layer_range=fraction maps the range to its depth, or set "
                             f"pruner.attention_layer_start/_end and mlp_layer_start/_end within 0..{layers}")

    def spans(self, layers: int) -> tuple[range, range]:
        return tuple(layer_span(*bounds, self.reference_layers, layers, self.layer_range)
                     for bounds in (self.attention_layers, self.mlp_layers))

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, dict[int, torch.Tensor]]:
        """Per pruned layer: a score per head (or key/value group) and per MLP neuron."""
        model = loaded.model
        heads, mlps = attention_heads(model), mlp_modules(model)
        if len(heads) != len(mlps):
            raise ValueError(f"{len(heads)} attention modules but {len(mlps)} MLPs: "
                             f"llm_pruner needs one of each per layer")
        attention, mlp = self.spans(len(heads))
        linears = [lin for i in attention for lin in (*heads[i].qkv_linears(), heads[i].out_proj)]
        linears += [m for i in mlp for m in mlps[i].modules() if isinstance(m, nn.Linear)]
        second = self.taylor in ("param_second", "param_mix")
        grads, squares = taylor_gradients(model, calibration_batches(loaded, calib, 1),
                                          [lin.weight for lin in linears], second)
        index = {id(lin): i for i, lin in enumerate(linears)}

        def per_weight(linear: nn.Linear) -> torch.Tensor:
            i = index[id(linear)]
            return salience(linear.weight, grads[i], squares[i] if second else None, self.taylor)

        with torch.no_grad():
            return {"attention": {i: head_scores(heads[i], per_weight, self.taylor, self.group_reduction).cpu()
                                  for i in attention},
                    "mlp": {i: neuron_scores(mlps[i], per_weight, self.taylor, self.group_reduction).cpu()
                            for i in mlp}}

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        """The `pruned_count` lowest of each layer's units go (stable on ties); a layer whose count
        would take all of them stays whole, as the release's check_pruning_group refuses that."""
        model = loaded.model
        heads, mlps = attention_heads(model), mlp_modules(model)
        heads_before = sum(h.n_heads for h in heads)
        for layer, score in scores["attention"].items():
            h = heads[layer]
            count = pruned_count(len(score) * h.head_dim, sparsity) // h.head_dim
            if 0 < count < len(score):
                h.remove(query_heads(h, torch.argsort(score, stable=True)[:count].tolist()))
        removed = total = 0
        for layer, score in scores["mlp"].items():
            count = pruned_count(len(score), sparsity)
            total += len(score)
            if 0 < count < len(score):
                keep_neurons(mlps[layer], torch.argsort(score, stable=True)[count:].sort().values)
                removed += count
        sync_config(model, heads)
        sync_intermediate(model, mlps)
        return {"sparsity/actual": removed / max(total, 1),
                "sparsity/heads": 1 - sum(h.n_heads for h in heads) / heads_before}
