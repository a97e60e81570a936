"""A bit-mask checkpoint, written as a lab would add an export format to prunebench (one class here
and `conf/export/bitmask.yaml`): the pruned state dict in one safetensors file, each tensor pruned to
at least `min_zeros` zeros stored as a bit mask of its nonzeros plus their values, so an unstructured
pruning at 50% stores about half of the dense bytes, where a Hugging Face folder stores every zero.
`pruning.json` beside it says where the weights came from; `load_state_dict` reads the file back
into the state dict the model had, which `model.load_state_dict` takes as is."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from prunebench.api.errors import ConfigError
from prunebench.export.writer import Writer

WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class BitmaskWriter(Writer):
    """export=bitmask. Tensors sharing storage (a tied LM head) are stored once, under the first name."""

    name: str = "bitmask"
    # a tensor with fewer zeros than this fraction is stored dense: its mask (1 bit a number) would
    # cost more than the zeros it saves
    min_zeros: float = 0.25
    # a state dict is all it needs: a timm model's too
    families: ClassVar[frozenset[str]] = frozenset({"causal_lm", "moe", "vlm", "encoder", "vision"})
    model_type: ClassVar[str] = "safetensors-bitmask"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.min_zeros, bool) or not isinstance(self.min_zeros, (int, float)) \
                or not 0 < self.min_zeros <= 1:
            raise ConfigError(f"export.min_zeros={self.min_zeros!r}: give the fraction of zeros in (0, 1] from which "
                              f"a tensor is stored as a mask and its values")

    def write(self, loaded, folder: Path, record: dict, before: None) -> None:
        tensors, masked, aliases, seen, dense = {}, {}, {}, {}, 0
        for name, tensor in loaded.model.state_dict().items():
            storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            if storage in seen:
                aliases[name] = seen[storage]
                continue
            seen[storage] = name
            tensor = tensor.detach().cpu().contiguous()
            dense += tensor.numel() * tensor.element_size()
            nonzero = tensor != 0
            if tensor.numel() and tensor.numel() - nonzero.sum().item() >= self.min_zeros * tensor.numel():
                tensors[f"{name}.values"] = tensor[nonzero]
                tensors[f"{name}.mask"] = torch.from_numpy(np.packbits(nonzero.reshape(-1).numpy()))
                masked[name] = list(tensor.shape)
            else:
                tensors[name] = tensor
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / WEIGHTS), metadata={"masked": json.dumps(masked), "aliases": json.dumps(aliases)})
        (folder / "pruning.json").write_text(json.dumps(
            {**record, "format": self.name, "min_zeros": self.min_zeros, "masked": sorted(masked),
             "bytes_stored": (folder / WEIGHTS).stat().st_size, "bytes_dense": dense}, indent=2) + "\n")


def load_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The state dict `BitmaskWriter` wrote into `folder`, each masked tensor rebuilt at its shape."""
    with safe_open(str(Path(folder) / WEIGHTS), framework="pt") as f:
        metadata = f.metadata()
        stored = {key: f.get_tensor(key) for key in f.keys()}
    masked = json.loads(metadata["masked"])
    state = {name: tensor for name, tensor in stored.items()
             if name not in {f"{key}.{part}" for key in masked for part in ("values", "mask")}}
    for name, shape in masked.items():
        bits = np.unpackbits(stored[f"{name}.mask"].numpy(), count=math.prod(shape)).astype(bool)
        values = stored[f"{name}.values"]
        tensor = values.new_zeros(shape)
        tensor[torch.from_numpy(bits).reshape(shape)] = values
        state[name] = tensor
    for alias, name in json.loads(metadata["aliases"]).items():
        state[alias] = state[name]
    return state
