"""A pruned model as a Hugging Face folder, loaded without remote code.

What a stock config can state is written smaller: the structured pruners already slice removed
layers, heads and MLP neurons out and, where every layer keeps the same widths, write the counts
into the config (pruners/layers.py, models/attention.sync_config, pruners/width.py). Decoder layers
left with different widths (heads ranked across the whole model, FLAP's adaptive structures,
LLM-Pruner's layer range) are stored at their own widths by default, the config stating the widest
(pruning.json's `layout: per_layer`, which prunebench's loader rebuilds: models/narrow.py), so the
folder is as small as the pruned model; padding them would store about the dense size. With
`pad` (export.padded=true), and always for a vision-language model (its loader builds the config's
shapes), they are written at a shape the config states, padded with zeros that add exactly nothing,
which plain `from_pretrained` loads:
- decoder layers left with different head counts: every layer padded to the widest layer's query
  heads per key/value head and key/value heads;
- decoder MLPs left with different widths: every MLP padded to the widest one's neurons.
Always padded: a CLIP or BERT tower's sliced heads (their config derives the head size from
hidden_size and the head count, so it cannot state fewer), back to the config's count. Biases a
pruner added to o_proj / down_proj (FLAP's compensation): the config's attention_bias / mlp_bias
set, the other projections' biases written as zeros. Unstructured and N:M sparsity are dense
tensors with zeros, as Wanda's and SparseGPT's code saves them. `pruning.json` says which of these
applies, and what was removed where."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from prunebench.api.errors import ConfigError
from prunebench.export.writer import Writer
from prunebench.models.attention import Heads, attention_heads, head_index, heads_adapter
from prunebench.models.introspection import count_parameters, is_composite, transformer_blocks
from prunebench.models.narrow import PER_LAYER, PRUNING_FILE, block_mlp, narrow_layers

# set on each language-model block before pruning: an attribute survives the copies a pruner makes
# (MoP's trial steps), so the export can name the original layers that were removed
LAYER_MARK = "prunebench_layer"


def mark_layers(model: nn.Module) -> None:
    for index, block in enumerate(transformer_blocks(model)[1]):
        setattr(block, LAYER_MARK, index)


def towers(model: nn.Module) -> tuple[str, ...]:
    return ("language", "vision") if is_composite(model) else ("language",)


def widths(model: nn.Module) -> dict[str, list[dict]]:
    """Per tower, per layer: its index in the unpruned model (`mark_layers`), attention heads (query
    and key/value) and MLP neurons (None where the MLP is not an up/down projection pair, as fused
    MoE experts)."""
    out = {"language": []}
    for position, block in enumerate(transformer_blocks(model)[1]):
        found = [adapter(0, m) for m in block.modules() if (adapter := heads_adapter(m))]
        mlp = block_mlp(block)
        entry = {"layer": getattr(block, LAYER_MARK, position)}
        if found:
            entry.update(heads=found[0].n_heads, kv_heads=found[0].n_kv_heads)
        entry["neurons"] = mlp.down_proj.in_features if mlp is not None else None
        out["language"].append(entry)
    if "vision" in towers(model):
        out["vision"] = [{"layer": h.layer, "heads": h.n_heads} for h in attention_heads(model, "vision")]
    return out


def structure(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> dict:
    """What was removed where: the original layers gone, and per tower the widths before and after."""
    kept = {entry["layer"] for entry in after["language"]}
    return {"layers_before": len(before["language"]),
            "layers_removed": [entry["layer"] for entry in before["language"] if entry["layer"] not in kept],
            **{tower: {"before": before[tower], "after": after[tower]} for tower in before}}


def sub_config(config, tower: str):
    """The config stating a tower's shapes (a composite model's text or vision config)."""
    if getattr(config, "text_config", None) is None:
        return config
    return config.text_config if tower == "language" else config.vision_config


def padded(heads: Heads, n_heads: int, n_kv_heads: int, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """State-dict entries of one attention module widened to `n_heads` query and `n_kv_heads`
    key/value heads. Key/value head j and its query heads keep the first slots of group j; the
    added heads have zero query, key, value and output-projection weights, so they contribute 0."""
    d, slots, group = heads.head_dim, heads.n_heads // heads.n_kv_heads, n_heads // n_kv_heads
    rows = head_index([(h // slots) * group + h % slots for h in range(heads.n_heads)], d)
    kv_rows = torch.arange(heads.n_kv_heads * d)
    out = {}

    def place(linear: nn.Linear, dim: int, size: int, index: torch.Tensor) -> None:
        for kind in ("weight", "bias"):
            tensor = getattr(linear, kind)
            if tensor is None or (kind == "bias" and dim == 1):
                continue
            shape = list(tensor.shape)
            shape[dim] = size
            out[f"{names[id(linear)]}.{kind}"] = tensor.detach().new_zeros(shape).index_copy_(
                dim, index.to(tensor.device), tensor.detach())

    q, k, v = heads.qkv_linears()
    place(q, 0, n_heads * d, rows)
    for linear in (k, v):
        place(linear, 0, n_kv_heads * d, kv_rows)
    place(heads.out_proj, 1, n_heads * d, rows)
    return out


def per_layer_note(part: str, uneven: int, total: int, widest: str) -> str:
    return (f"language {part}: {uneven} of {total} layers keep fewer {widest.split()[-1]} than the config states "
            f"({widest}, the widest layer's); each is stored at its own (layout {PER_LAYER}): prunebench's loader "
            f"narrows it as `structure` says, plain from_pretrained refuses the folder (export.padded=true pads them)")


def stated_heads(model: nn.Module, pad: bool) -> tuple[dict[str, torch.Tensor], dict[str, dict], list[str]]:
    """(state-dict entries replaced by padded ones, config fields per tower, notes for pruning.json).
    `pad=False`: decoder layers with fewer heads keep their own count (the config states the widest)."""
    names = {id(m): name for name, m in model.named_modules()}
    tensors, fields, notes = {}, {}, []
    for tower in towers(model):
        heads = attention_heads(model, tower)
        if all(getattr(h, "config_states_heads", False) for h in heads):
            kv = max(h.n_kv_heads for h in heads)
            target = (kv * max(h.n_heads // h.n_kv_heads for h in heads), kv)
            fields[tower] = {"num_attention_heads": target[0], "num_key_value_heads": kv, "head_dim": heads[0].head_dim}
        else:
            count = sub_config(model.config, tower).num_attention_heads
            target = (count, count)
        uneven = [h for h in heads if (h.n_heads, h.n_kv_heads) != target]
        if uneven and not pad and tower in fields:
            notes.append(per_layer_note("attention", len(uneven), len(heads), f"{target[0]} query and {target[1]} key/value heads"))
            continue
        for h in uneven:
            tensors.update(padded(h, *target, names))
        if uneven:
            notes.append(f"{tower} attention: {len(uneven)} of {len(heads)} layers kept fewer heads than a stock config "
                         f"can state for every layer; they are stored with {target[0]} query and {target[1]} key/value "
                         f"heads, the added heads all zeros (they add exactly nothing); `structure` has each layer's "
                         f"real count")
    return tensors, fields, notes


def block_mlps(model: nn.Module) -> list[nn.Module]:
    """Each decoder block's dense MLP (`mlp` with up/down projections; an MoE block has none)."""
    return [block.mlp for block in transformer_blocks(model)[1]
            if all(isinstance(getattr(getattr(block, "mlp", None), p, None), nn.Linear) for p in ("up_proj", "down_proj"))]


def widened(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[dim] = size - shape[dim]
    return torch.cat([tensor.detach(), tensor.detach().new_zeros(shape)], dim)


def stated_neurons(model: nn.Module, pad: bool) -> tuple[dict[str, torch.Tensor], dict[str, dict], list[str]]:
    """Decoder MLPs left with different widths (neurons ranked across the whole model, as FLAP's
    adaptive structures), each stored at the widest one's: the added neurons have zero gate/up rows
    and zero down_proj columns, so they add exactly nothing. Same returns and `pad` as `stated_heads`."""
    names = {id(m): name for name, m in model.named_modules()}
    mlps = block_mlps(model)
    widest = max((m.down_proj.in_features for m in mlps), default=0)
    uneven = [m for m in mlps if m.down_proj.in_features != widest]
    if not uneven:
        return {}, {}, []
    if not pad:
        return {}, {"language": {"intermediate_size": widest}}, [
            per_layer_note("MLP", len(uneven), len(mlps), f"{widest} neurons")]
    tensors = {}
    for mlp in uneven:
        for proj, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            linear = getattr(mlp, proj, None)
            if isinstance(linear, nn.Linear):
                tensors[f"{names[id(linear)]}.weight"] = widened(linear.weight, dim, widest)
                if linear.bias is not None and dim == 0:
                    tensors[f"{names[id(linear)]}.bias"] = widened(linear.bias, 0, widest)
    return tensors, {"language": {"intermediate_size": widest}}, [
        f"language MLP: {len(uneven)} of {len(mlps)} layers kept fewer neurons than a stock config can state for "
        f"every layer; they are stored with {widest}, the added neurons all zeros (they add exactly nothing); "
        f"`structure` has each layer's real count"]


def stated_biases(model: nn.Module, state: dict[str, torch.Tensor], config) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Biases a pruner put on output projections (FLAP's compensation on o_proj / down_proj): a Llama
    config turns biases on for all of q/k/v/o (`attention_bias`) or gate/up/down (`mlp_bias`) at
    once, so it gets that field set and the other projections zero biases, sized from `state` (padded
    where padding applies). Returns (the zero biases, notes for pruning.json)."""
    names = {id(m): name for name, m in model.named_modules()}
    groups = {"attention_bias": [[*h.qkv_linears(), h.out_proj] for h in attention_heads(model)
                                 if getattr(h, "config_states_heads", False)],
              "mlp_bias": [[getattr(m, p) for p in ("gate_proj", "up_proj", "down_proj")
                            if isinstance(getattr(m, p, None), nn.Linear)] for m in block_mlps(model)]}
    text = sub_config(config, "language")
    tensors, notes = {}, []
    for field, modules in groups.items():
        if getattr(text, field, False) is True or all(group[-1].bias is None for group in modules):
            continue
        if not hasattr(text, field):
            raise ValueError(f"the pruned {type(model).__name__} has biases on its "
                             f"{names[id(modules[0][-1])].rsplit('.', 1)[-1]} projections, which its config ({text.model_type}) "
                             f"cannot state: it has no "
                             f"`{field}`; export writes such biases for Llama-style configs")
        setattr(text, field, True)
        for linear in (lin for group in modules for lin in group if lin.bias is None):
            weight = state[f"{names[id(linear)]}.weight"]
            tensors[f"{names[id(linear)]}.bias"] = weight.new_zeros(weight.shape[0])
        notes.append(f"{field}: the pruner added biases to the output projections; the config's {field} turns them "
                     f"on for every projection of that kind, so the others are stored as zeros")
    return tensors, notes


def check_shapes(model: nn.Module, config, state: dict[str, torch.Tensor], layers: list[dict] | None) -> list[int]:
    """Every tensor has the shape the written config builds (the architecture built on the meta
    device, no memory), with each layer narrowed to its widths in `layers` as the loader narrows it
    (None: padded, the config's shapes): a mismatch would only surface when someone loads the
    folder. Returns the positions of the layers stored narrower than the config states."""
    with torch.device("meta"):
        reference = type(model)(config)
        narrowed = narrow_layers(reference, layers) if layers is not None else []
    expected = {key: tuple(t.shape) for key, t in reference.state_dict().items()}
    wrong = [f"{key}: {tuple(t.shape)}, config gives {expected.get(key)}"
             for key, t in state.items() if expected.get(key) != tuple(t.shape)]
    if wrong:
        raise ValueError(f"the pruned {type(model).__name__} has shapes its config cannot state, so it cannot be "
                         f"exported as a Hugging Face folder ({len(wrong)} tensors): " + "; ".join(wrong[:5]))
    return narrowed


def write_pretrained(loaded, folder: Path, record: dict, before: dict[str, list[dict]], pad: bool = False) -> dict:
    """Writes `loaded` (pruned) into `folder`: safetensors, config.json, generation config,
    tokenizer or processor, and pruning.json (`record` plus structure, dtype and notes). `before`:
    `widths` of the model before pruning. `pad` (export.padded): layers of uneven widths padded to
    the config's stock shape instead of stored at their own. Returns what pruning.json holds."""
    from transformers import PreTrainedModel

    model = loaded.model
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"{type(model).__name__} is not a Hugging Face model: export writes a from_pretrained folder")
    pad = pad or is_composite(model)  # the vision-language loader (models/vlm.py) builds the config's shapes
    tensors, fields, notes = stated_heads(model, pad)
    mlp_tensors, mlp_fields, mlp_notes = stated_neurons(model, pad)
    tensors, notes = {**tensors, **mlp_tensors}, notes + mlp_notes
    for tower, values in mlp_fields.items():
        fields.setdefault(tower, {}).update(values)
    config = copy.deepcopy(model.config)
    for tower, values in fields.items():
        for key, value in values.items():
            setattr(sub_config(config, tower), key, value)
    state = {**model.state_dict(), **tensors}
    biases, bias_notes = stated_biases(model, state, config)
    state.update(biases)
    after = widths(model)
    narrowed = check_shapes(model, config, state, None if pad else after["language"])
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, state_dict=state)
    config.save_pretrained(folder)  # the widest layer's head counts and neurons, where layers differ
    (loaded.processor or loaded.tokenizer).save_pretrained(folder)
    pruning = {**record, "dtype": str(model.dtype).removeprefix("torch."), "params_stored": stored_parameters(folder),
               "params_nonzero": count_parameters(model, nonzero=True),
               "structure": structure(before, after),
               # per_layer: some layer is narrower than config.json states, and only prunebench's loader narrows it
               "layout": PER_LAYER if narrowed else "stock",
               "padded": bool(tensors),  # some layer stored with all-zero heads or neurons
               "storage": [*notes, *bias_notes, "removed layers are gone, and so are heads and MLP neurons wherever every layer "
                                   "keeps the same number or the layout is per_layer; pruned single weights "
                                   "(unstructured, N:M) are zeros in dense tensors"]}
    (folder / PRUNING_FILE).write_text(json.dumps(pruning, indent=2) + "\n")
    return pruning


def stored_parameters(folder: Path) -> int:
    """Numbers in the folder's safetensors files, read from their headers (a tied LM head is stored once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    return total


@dataclass(frozen=True)
class HFFolder(Writer):
    """export=hf: the Hugging Face folder above (`write_pretrained`). `padded`: layers of different
    widths padded with zeros to one stock shape, which plain `from_pretrained` loads, instead of each
    stored at its own widths for prunebench's loader. A timm model (family vision) has no such folder."""

    name: str = "hf"
    padded: bool = False
    model_type: ClassVar[str] = "transformers"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.padded, bool):
            raise ConfigError(f"export.padded={self.padded!r}: use false (layers of different widths stored at their "
                              f"own, for prunebench's loader) or true (padded to one stock shape for plain "
                              f"from_pretrained)")

    def before_pruning(self, model: nn.Module) -> dict[str, list[dict]]:
        """Each layer's widths (pruning.json's `structure`), and the layers marked so that the ones a
        pruner removes can be named."""
        mark_layers(model)
        return widths(model)

    def write(self, loaded, folder: Path, record: dict, before: dict) -> None:
        write_pretrained(loaded, folder, record, before, self.padded)
