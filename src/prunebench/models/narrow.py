"""Decoder layers at widths of their own: narrowing a layer's attention heads and MLP neurons, which
the structured pruners do to prune and the loader does to rebuild an export stored so.

A stock transformers config states one head count and one MLP width for every layer; FLAP's
adaptive structures, heads ranked across the model and LLM-Pruner's layer range leave layers
different. The export (export/folder.py) stores each layer at its own widths, its config stating
the widest and pruning.json's `structure` each layer's (`layout: per_layer`). `load_narrowed`
builds the model from the config, narrows every layer to its stored widths and loads the weights
strictly. transformers knows no per-layer width (`from_pretrained` builds the config's shapes and
refuses others), hence these lines by hand."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from transformers.pytorch_utils import prune_linear_layer

from prunebench.models.attention import DecoderHeads, heads_adapter
from prunebench.models.introspection import transformer_blocks
from prunebench.models.lean import checkpoint_files

IN_PROJS = ("gate_proj", "up_proj")
PRUNING_FILE = "pruning.json"
PER_LAYER = "per_layer"  # pruning.json's `layout` where some layer is stored narrower than its config states


@torch.no_grad()
def keep_neurons(mlp: nn.Module, kept: torch.Tensor) -> None:
    for name in IN_PROJS:
        if isinstance(getattr(mlp, name, None), nn.Linear):
            setattr(mlp, name, prune_linear_layer(getattr(mlp, name), kept, dim=0))
    mlp.down_proj = prune_linear_layer(mlp.down_proj, kept, dim=1)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(kept)


def block_mlp(block: nn.Module) -> nn.Module | None:
    """The block's MLP with an up/down projection pair (None for fused MoE experts): the one whose
    width `export.widths` records."""
    return next((m for m in block.modules() if isinstance(getattr(m, "down_proj", None), nn.Linear)), None)


def narrow_layers(model: nn.Module, layers: list[dict]) -> list[int]:
    """Each decoder block cut to the widths `layers` gives it (pruning.json's `structure`, in block
    order: `heads`, `kv_heads`, `neurons`), keeping its first heads and neurons: the weights are
    loaded after. Returns the positions of the blocks it narrowed."""
    blocks = transformer_blocks(model)[1]
    if len(layers) != len(blocks):
        raise ValueError(f"the structure lists {len(layers)} layers but the config builds {len(blocks)}")
    narrowed = []
    for position, (block, want) in enumerate(zip(blocks, layers)):
        heads = [adapter(position, m) for m in block.modules() if (adapter := heads_adapter(m)) is DecoderHeads]
        mlp = block_mlp(block)
        cut = False
        if heads and "heads" in want and (heads[0].n_heads, heads[0].n_kv_heads) != (want["heads"], want["kv_heads"]):
            heads[0].narrow(want["heads"], want["kv_heads"])
            cut = True
        if mlp is not None and want.get("neurons") is not None and mlp.down_proj.in_features != want["neurons"]:
            keep_neurons(mlp, torch.arange(want["neurons"]))
            cut = True
        if cut:
            narrowed.append(position)
    return narrowed


def stored_layers(folder: Path) -> list[dict] | None:
    """Each language layer's stored widths when `folder` is an export stored per layer, else None."""
    path = folder / PRUNING_FILE
    if not path.is_file():
        return None
    pruning = json.loads(path.read_text())
    return pruning["structure"]["language"]["after"] if pruning.get("layout") == PER_LAYER else None


@contextmanager
def default_dtype(dtype: torch.dtype):
    """New layers (`prune_linear_layer` makes them at the default dtype) at the model's dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_narrowed(folder: str, dtype: torch.dtype, device_map=None, **kwargs):
    """The causal LM exported in local `folder` with its layers at their own widths, or None where
    `folder` is no such export (the caller loads it plainly). Every parameter comes from the
    safetensors files: a missing, unexpected or misshapen tensor fails the load, naming it."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    local = Path(folder).expanduser()
    layers = stored_layers(local) if local.is_dir() else None
    if layers is None:
        return None
    if device_map:
        raise ValueError(f"model.path={folder!r} is an export whose layers keep widths of their own ({PRUNING_FILE}: "
                         f"layout {PER_LAYER}), which model.device_map cannot place; load it on one device "
                         f"(model.device), or export it again with export.padded=true")
    config = AutoConfig.from_pretrained(local)
    with no_init_weights(), default_dtype(dtype):  # every weight is read from the files below
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
        narrow_layers(model, layers)
    state = {key: tensor for path in checkpoint_files(local) or [] for key, tensor in load_file(str(path)).items()}
    for target, source in model.all_tied_weights_keys.items():  # a tied head is stored once
        if target not in state and source in state:
            state[target] = state[source]
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"model.path={folder!r}: its weights do not match the layers {PRUNING_FILE} states: {err}") from None
    # built under no_init_weights, which skips the tying too: a head the config ties would stay a second
    # copy of the embeddings (SmolLM2 pruned 20%: 150M parameters for 122M)
    model.tie_weights()
    model.config._name_or_path = model.name_or_path = folder
    if model.can_generate() and (local / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(local)
    return model
