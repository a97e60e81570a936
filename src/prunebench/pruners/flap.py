"""FLAP (An et al., AAAI 2024; released code github.com/CASIA-IVA-Lab/FLAP): width pruning by
fluctuation, with the removed channels' mean put back as a bias.

A channel of the attention output projection's input (a head's outputs) or of the MLP down
projection's input (a neuron) that barely varies over calibration samples carries little beyond
its mean, so the layer can drop it and add `W[:, removed] @ mean[removed]` to its output as a bias
instead. Channels are scored per layer (`metric`), the scores standardised within each layer so
that layers compare, and the widths allocated by one of the release's structures: adaptive across
layers (`AL-*`: one ranking over the whole model) or uniform (`UL-*`), with attention and MLP
ranked together by parameter cost (`*-AM`) or given a number of heads to remove (`*-MM`).

Under grouped-query attention the unit removed is a key/value group (a key/value head with its
query heads): removing single query heads would leave groups of unequal size, which the module
cannot run without inert slots that keep their parameters. With one key/value head per query head
(Llama-1/2, the release's models) a group is a head and everything below is the release's rule."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from prunebench.models.attention import Heads, attention_heads, sync_config
from prunebench.models.loaded import LoadedModel
from prunebench.models.narrow import IN_PROJS, keep_neurons
from prunebench.pruners.base import config_value
from prunebench.pruners.structured import StructuredPruner, calibration_batches, observe
from prunebench.pruners.width import mlp_modules, sync_intermediate

log = logging.getLogger(__name__)

METRICS = ("IFV", "WIFV", "WIFN")  # input fluctuation, weighted by |W column|^2, weighted input norm
STRUCTURES = ("AL-AM", "AL-MM", "UL-UM", "UL-MM")
# what keeps each structure short of its target, said when it falls short by more than SHORTFALL
EMPTIED = "a layer that loses every key/value group keeps one, zeroed, since attention cannot run with none; its weights still count"
REACH = {"AL-AM": EMPTIED, "AL-MM": EMPTIED,
         "UL-UM": "each layer removes int(sparsity x its groups) whole key/value groups",
         "UL-MM": "remove_heads is spread over the layers in whole key/value groups"}
SHORTFALL = 0.02


class InputStats:
    """The release's running statistics (BiasGPT) of one projection's input channels, updated once
    per calibration sample (a sequence), each sample weighing the same whatever its length."""

    def __init__(self, width: int, device):
        self.n = 0
        self.mean, self.fluctuation, self.square = (torch.zeros(width, device=device) for _ in range(3))

    def add(self, x: torch.Tensor) -> None:
        """`x`: one sample's [tokens, channels]."""
        x, n = x.float(), self.n
        self.mean.mul_(n / (n + 1)).add_(x.mean(0) / (n + 1))
        self.square.mul_(n / (n + 1)).add_(x.pow(2).sum(0) / (n + 1))
        if n:
            # the release's update: both deviations from the mean already updated with this sample (its
            # "old" mean is the same tensor, changed in place), the first sample left out of the sum
            self.fluctuation.mul_((n - 1) / n).add_((x - self.mean).pow(2).sum(0) / (n + 1))
        self.n += 1


def channel_scores(metric: str, stats: InputStats, weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach().float()
    if metric == "IFV":
        return stats.fluctuation.clone()
    if metric == "WIFV":
        return stats.fluctuation * w.pow(2).sum(0)
    return (w.abs() * stats.square.sqrt()[None]).mean(0)


def layers(model: nn.Module) -> tuple[list[Heads], list[nn.Module]]:
    heads, mlps = attention_heads(model), mlp_modules(model)
    if len(heads) != len(mlps):
        raise ValueError(f"{len(heads)} attention modules but {len(mlps)} MLPs: FLAP needs one of each per layer")
    return heads, mlps


@torch.no_grad()
def flap_scores(model: nn.Module, batches: list[dict], metric: str) -> dict[str, list[torch.Tensor]]:
    """Per layer: the score of each o_proj input channel (squared, as the release scores heads) and
    each down_proj input channel, and the channels' calibration means (the compensation)."""
    heads, mlps = layers(model)
    projections = [h.out_proj for h in heads] + [m.down_proj for m in mlps]
    stats = [InputStats(p.in_features, p.weight.device) for p in projections]
    current = {}

    def hook(stat: InputStats, module, args):
        mask = current["mask"]
        for row, x in enumerate(args[0]):
            stat.add(x if mask is None else x[mask[row].bool()])

    with ExitStack() as stack:
        for projection, stat in zip(projections, stats):
            stack.callback(projection.register_forward_pre_hook(lambda m, a, s=stat: hook(s, m, a)).remove)
        for batch in batches:
            current["mask"] = batch.get("attention_mask")
            observe(model, batch)
    scores = [channel_scores(metric, s, p.weight).cpu() for s, p in zip(stats, projections)]
    means = [s.mean.cpu() for s in stats]
    n = len(heads)
    return {"heads": [s.pow(2) for s in scores[:n]], "neurons": scores[n:], "head_means": means[:n],
            "neuron_means": means[n:]}


@dataclass(frozen=True)
class Shape:
    """The model's prunable widths and what one unit of each costs in weights."""
    layers: int
    units: int  # key/value groups per layer
    channels: int  # o_proj input channels per group
    neurons: int
    unit_params: int
    neuron_params: int

    @classmethod
    def of(cls, heads: list[Heads], mlps: list[nn.Module]) -> Shape:
        h, mlp = heads[0], mlps[0]
        q, k, v = h.qkv_linears()
        group = h.n_heads // h.n_kv_heads
        unit = h.head_dim * (group * (q.in_features + h.out_proj.out_features) + k.in_features + v.in_features)
        neuron = sum(lin.in_features for lin in in_projs(mlp)) + mlp.down_proj.out_features
        return cls(len(heads), h.n_kv_heads, group * h.head_dim, mlp.down_proj.in_features, unit, neuron)

    @classmethod
    def from_config(cls, config) -> Shape | None:
        """The same widths from the checkpoint's config, before the model loads; None where the config
        does not say them. The MLP is taken as gated (gate/up/down), as in every family FLAP reaches."""
        layers, hidden = config_value(config, "num_hidden_layers"), config_value(config, "hidden_size")
        heads, neurons = config_value(config, "num_attention_heads"), config_value(config, "intermediate_size")
        if not (layers and hidden and heads and neurons):
            return None
        kv_heads = config_value(config, "num_key_value_heads") or heads
        head_dim = config_value(config, "head_dim") or hidden // heads
        group = heads // kv_heads
        return cls(layers, kv_heads, group * head_dim, neurons, head_dim * (2 * group * hidden + 2 * hidden), 3 * hidden)

    def check_removal(self, structure: str, sparsity: float, remove_heads: int) -> None:
        """The *-MM structures' `remove_heads` and the neurons left to remove must fit the model: the
        release fails (or removes everything) past them."""
        if structure == "UL-MM" and remove_heads // self.layers >= self.units:
            raise ValueError(f"FLAP UL-MM: remove_heads={remove_heads} over {self.layers} layers removes "
                             f"{remove_heads // self.layers} of each layer's {self.units} key/value groups; "
                             f"at most {self.units * self.layers - 1} leaves one per layer")
        if structure == "AL-MM" and remove_heads > self.layers * self.units:
            raise ValueError(f"FLAP AL-MM: remove_heads={remove_heads} is more than the model's "
                             f"{self.layers * self.units} key/value groups ({self.layers} layers x {self.units})")
        count, available = self.neurons_to_remove(structure, sparsity, remove_heads), self.neurons
        if structure == "AL-MM":
            available *= self.layers
        if count > available - (structure == "UL-MM"):
            raise ValueError(f"FLAP {structure}: sparsity={sparsity} with remove_heads={remove_heads} asks for "
                             f"{count} neurons of {available}; lower sparsity or raise remove_heads")

    def neurons_to_remove(self, structure: str, sparsity: float, remove_heads: int) -> int:
        """The release's cal_remove_neuron: the parameter budget of `sparsity` less what the removed
        heads free, in neurons (per layer for UL-MM, over the model for AL-MM)."""
        layer = self.units * self.unit_params + self.neurons * self.neuron_params
        if structure == "UL-MM":
            budget, heads = sparsity * layer, remove_heads // self.layers
        else:
            budget, heads = self.layers * sparsity * layer, remove_heads
        count = int((budget - self.unit_params * heads) / self.neuron_params)
        if count < 0:
            raise ValueError(f"FLAP {structure}: remove_heads={remove_heads} frees more parameters than "
                             f"sparsity={sparsity} allows; lower remove_heads or raise sparsity")
        return count


def in_projs(mlp: nn.Module) -> list[nn.Linear]:
    return [getattr(mlp, p) for p in IN_PROJS if isinstance(getattr(mlp, p, None), nn.Linear)]


def standardised(scores: list[torch.Tensor]) -> torch.Tensor:
    """[layers, channels], each layer's scores less their mean over their standard deviation."""
    x = torch.stack(scores)
    return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)


def above_lowest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Kept: strictly above the k-th lowest (the release's AL-MM). k=0 keeps all, where the
    release's sorted[-0] would be the highest and remove everything."""
    if k > x.numel():
        raise ValueError(f"FLAP: cannot remove {k} of the model's {x.numel()} units")
    return torch.ones_like(x, dtype=torch.bool) if k == 0 else x > x.flatten().sort().values[k - 1]


def from_lowest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Kept: at or above the one k-th from the lowest (the release's uniform structures)."""
    if k >= x.numel():
        raise ValueError(f"FLAP: cannot remove {k} of a layer's {x.numel()} units")
    return x >= x.sort().values[k]


def allocate(structure: str, scores: dict, sparsity: float, remove_heads: int,
             shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept groups [layers, units], kept neurons [layers, neurons]) as the release's prune_flap
    decides them, its thresholds and tie rules included."""
    if structure.startswith("UL"):
        groups = [s.reshape(shape.units, shape.channels).sum(1) for s in scores["heads"]]
        if structure == "UL-UM":
            heads, neurons = int(sparsity * shape.units), int(shape.neurons * sparsity)
        else:
            heads = remove_heads // shape.layers
            neurons = shape.neurons_to_remove(structure, sparsity, remove_heads)
        return (torch.stack([from_lowest(g, heads) for g in groups]),
                torch.stack([from_lowest(s, neurons) for s in scores["neurons"]]))
    attn = standardised(scores["heads"]).reshape(shape.layers, shape.units, shape.channels).mean(2)
    mlp = standardised(scores["neurons"])
    if structure == "AL-MM":
        return (above_lowest(attn, remove_heads),
                above_lowest(mlp, shape.neurons_to_remove(structure, sparsity, remove_heads)))
    # AL-AM: one ranking; each unit weighs its parameters in neurons, an integer as in the release
    # (its weight tensor is int64, so a Llama head's 512/3 is stored as 170)
    values, order = torch.cat([attn.flatten(), mlp.flatten()]).sort(descending=True)
    weights = torch.ones_like(order)
    weights[order < attn.numel()] = shape.unit_params // shape.neuron_params
    cut = torch.argmin((weights.cumsum(0) - weights.sum() * (1 - sparsity)).abs())
    return attn > values[cut], mlp > values[cut]


@torch.no_grad()
def compensate(linear: nn.Linear, mean: torch.Tensor, removed: torch.Tensor) -> None:
    """The removed inputs replaced by their calibration mean, which the layer adds as a bias."""
    w = linear.weight
    shift = (w[:, removed].float() @ mean[removed].to(w.device).float()).to(w.dtype)
    if linear.bias is None:
        linear.bias = nn.Parameter(shift, requires_grad=w.requires_grad)
    else:
        linear.bias += shift


@torch.no_grad()
def prune_flap(model: nn.Module, scores: dict, kept_groups: torch.Tensor, kept_neurons: torch.Tensor,
               bias: bool = True) -> None:
    heads, mlps = layers(model)
    for h, mlp, groups, neurons, head_mean, neuron_mean in zip(
            heads, mlps, kept_groups, kept_neurons, scores["head_means"], scores["neuron_means"]):
        if bias:
            compensate(h.out_proj, head_mean, ~groups.repeat_interleave(h.out_proj.in_features // len(groups)))
            compensate(mlp.down_proj, neuron_mean, ~neurons)
        h.remove({q for q in range(h.n_heads) if not groups[h.kv_of(q)]})
        keep_neurons(mlp, torch.nonzero(neurons).flatten())
    sync_config(model, heads)
    sync_intermediate(model, mlps)


def projection_params(heads: list[Heads], mlps: list[nn.Module]) -> int:
    """The weights of q/k/v/o and the MLP projections: what the release's pruning ratio is a fraction of."""
    linears = [lin for h in heads for lin in (*h.qkv_linears(), h.out_proj)]
    linears += [lin for m in mlps for lin in (*in_projs(m), m.down_proj)]
    return sum(lin.weight.numel() for lin in linears)


class FlapPruner(StructuredPruner):
    """`flap`: sparsity = the release's pruning ratio, the fraction of the attention and MLP
    projections' weights to remove (AL-AM reaches it through the cost-weighted ranking, UL-UM as the
    fraction of every layer's groups and neurons, the *-MM structures after `remove_heads`).
    `sparsity/actual` is the fraction of those weights removed."""

    families = frozenset({"causal_lm"})  # decoders with q/k/v/o attention and an up/down MLP
    needs_calibration = True
    onload_refusal = "it ranks the channels of all layers together and narrows every layer in one step"

    def __init__(self, name: str = "flap", metric: str = "WIFV", structure: str = "AL-AM", remove_heads: int = 8,
                 bias: bool = True, batch_size: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        if metric not in METRICS:
            raise ValueError(f"pruner {name}: metric={metric!r}; valid: {list(METRICS)}")
        if structure not in STRUCTURES:
            raise ValueError(f"pruner {name}: structure={structure!r}; valid: {list(STRUCTURES)}")
        if structure.endswith("MM") and remove_heads < 0:
            raise ValueError(f"pruner {name}: structure={structure} removes remove_heads heads; "
                             f"remove_heads={remove_heads} must be >= 0")
        self.metric, self.structure, self.remove_heads = metric, structure, remove_heads
        self.bias, self.batch_size = bias, batch_size

    def check_config(self, config, sparsity: float) -> None:
        shape = Shape.from_config(config)
        if shape is not None and self.structure.endswith("MM"):
            shape.check_removal(self.structure, sparsity, self.remove_heads)

    def score(self, loaded: LoadedModel, calib=None):
        return flap_scores(loaded.model, calibration_batches(loaded, calib, self.batch_size), self.metric)

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        heads, mlps = layers(loaded.model)
        shape = Shape.of(heads, mlps)
        before, n_heads = projection_params(heads, mlps), sum(h.n_heads for h in heads)
        kept_groups, kept_neurons = allocate(self.structure, scores, sparsity, self.remove_heads, shape)
        prune_flap(loaded.model, scores, kept_groups, kept_neurons, self.bias)
        heads, mlps = layers(loaded.model)
        actual = 1 - projection_params(heads, mlps) / before
        if sparsity - actual > SHORTFALL:
            log.warning("FLAP %s removed %.3f of the attention and MLP projections' weights, short of sparsity=%g: "
                        "its structure cannot reach more on this model (%s); sparsity/actual records what it removed",
                        self.structure, actual, sparsity, REACH[self.structure])
        return {"sparsity/actual": actual,
                "sparsity/heads": 1 - sum(h.n_heads - len(h.inert()) for h in heads) / n_heads,
                "sparsity/neurons": 1 - float(kept_neurons.float().mean()),
                "flap/layers_without_heads": float(sum(not g.any() for g in kept_groups)),
                "flap/min_layer_neurons_kept": float(kept_neurons.sum(1).min()) / shape.neurons}

