"""Depth pruning: whole transformer blocks removed; sparsity is the fraction of blocks removed.

`layers_bi` removes the blocks with the lowest block influence, 1 - cos(h_in, h_out) averaged
over calibration tokens (ShortGPT): a block that barely turns its input changes little.
`layers_last` removes blocks from the end but keeps the last two (MoP's L step)."""

from __future__ import annotations

import math
from contextlib import ExitStack

import torch
from torch import nn

from prunebench.models.introspection import tower_config, transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.structured import StructuredPruner, calibration_batches, observe


def remove_layers(model: nn.Module, drop: set[int]) -> None:
    """Delete blocks and renumber what is indexed by layer (the KV cache slots, the config's
    per-layer attention types), so the shorter model runs, caches and saves as an ordinary one."""
    prefix, blocks = transformer_blocks(model)
    kept = [block for i, block in enumerate(blocks) if i not in drop]
    parent, _, attr = prefix.rpartition(".")
    setattr(model.get_submodule(parent), attr, nn.ModuleList(kept))
    for i, block in enumerate(kept):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = i
    config = tower_config(model, "language")
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [t for i, t in enumerate(config.layer_types) if i not in drop]
    config.num_hidden_layers = len(kept)


@torch.no_grad()
def block_influence(model: nn.Module, batches: list[dict]) -> torch.Tensor:
    """1 - mean cosine similarity between each block's input and output hidden states."""
    _, blocks = transformer_blocks(model)
    total = torch.zeros(len(blocks), dtype=torch.float64)
    tokens = 0

    def hook(i, module, args, kwargs, out):
        h_in = args[0] if args else kwargs["hidden_states"]
        h_out = out[0] if isinstance(out, tuple) else out
        total[i] += float(torch.nn.functional.cosine_similarity(h_in.float(), h_out.float(), dim=-1).sum())

    with ExitStack() as stack:
        for i, block in enumerate(blocks):
            handle = block.register_forward_hook(lambda *a, i=i: hook(i, *a), with_kwargs=True)
            stack.callback(handle.remove)
        for batch in batches:
            observe(model, batch)
            tokens += batch["input_ids"].numel()
    return (1 - total / tokens).float()


class LayerPruner(StructuredPruner):
    """A vision-language model loses blocks of its language model (the only tower it takes)."""

    families = frozenset({"causal_lm", "vlm"})

    def drop(self, scores, n_layers: int, n: int) -> set[int]:
        raise NotImplementedError

    def count(self, n_layers: int, sparsity: float) -> int:
        """Blocks to remove: rounded down (a method's release may round otherwise)."""
        return math.floor(n_layers * sparsity + 1e-9)

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        n_layers = len(transformer_blocks(loaded.model)[1])
        drop = self.drop(scores, n_layers, self.count(n_layers, sparsity))
        remove_layers(loaded.model, drop)
        return {"sparsity/actual": len(drop) / n_layers}


class BlockInfluencePruner(LayerPruner):
    needs_calibration = True

    def __init__(self, name: str = "layers_bi", batch_size: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        self.batch_size = batch_size

    def score(self, loaded: LoadedModel, calib=None) -> torch.Tensor:
        return block_influence(loaded.model, calibration_batches(loaded, calib, self.batch_size))

    def drop(self, scores, n_layers, n):
        return set(torch.argsort(scores, stable=True)[: min(n, n_layers - 1)].tolist())


class LastLayersPruner(LayerPruner):
    """MoP's L step, repeated: delete the block at index len - 3 (the last two always stay)."""

    cacheable = False

    def drop(self, scores, n_layers, n):
        n = min(n, n_layers - 2)
        return set(range(n_layers - 2 - n, n_layers - 2))
