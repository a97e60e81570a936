"""A model whose decoder blocks accelerate keeps off the device: a `model.device_map` with `cpu` or
`disk` entries, or `pruning.onload` (sequential onloading: the blocks stay in host memory, or in
the checkpoint's safetensors on disk, and each comes to `model.device` when it runs).

Between forwards an offloaded module's weights are on the `meta` device; accelerate's hooks bring
them from their store (its `weights_map`) for each forward and drop them after. Code that reads or
edits weights does it inside `onloaded(module)`: the weights come once and stay for the block's
whole calibration pass and pruning, the hooks leave them alone meanwhile, and on leaving, what the
block holds then (pruned, reshaped, a bias added) is written back to the store, so every later
forward, evaluation and export read the pruned weights. A module accelerate does not offload is
left as it is, so the same pruner code serves an in-memory model unchanged.

`onload_map` is the `device_map` that `pruning.onload` loads with; `Footprint` is what a job needs
in memory, read from a config on the `meta` device before any weights load."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

ONLOAD = ("none", "sequential", "auto")


def offloaded_modules(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if has_offloaded_params(m)]


def has_offloaded_params(module: nn.Module) -> bool:
    """accelerate offloads the module's own tensors (a model accelerate has not placed: never)."""
    hook = getattr(module, "_hf_hook", None)
    return hook is not None and getattr(hook, "offload", False)


def is_offloaded(model: nn.Module) -> bool:
    return bool(offloaded_modules(model))


def execution_device(module: nn.Module) -> torch.device:
    """Where `module` computes: its offload hook's device, else where its first parameter lives."""
    hook = getattr(module, "_hf_hook", None)
    if getattr(hook, "offload", False):
        return torch.device(hook.execution_device)
    return next(module.parameters()).device


@contextmanager
def onloaded(module: nn.Module, edits: bool = True):
    """`module`'s offloaded weights on their execution device for the block's duration, written back
    to their store when it ends without an error (dropped either way); `edits` False: only read, so
    nothing is written back."""
    hooked = offloaded_modules(module)
    for m in hooked:
        m._hf_hook.pre_forward(m)
        m._hf_hook.offload = False  # its forwards meanwhile run on these weights, not the store's
    try:
        yield
        for m in hooked if edits else ():
            store(m)
    finally:
        for m in hooked:
            m._hf_hook.offload = True
            m._hf_hook.post_forward(m, None)


@contextmanager
def left_in_place(model: nn.Module):
    """A model accelerate placed (its `hf_device_map`) kept where its hooks put it while a caller moves
    the module holding it: Lightning moves the whole LightningModule to one device before testing and
    back after, which would copy an offloaded (`meta`) tensor, or gather a model spread over GPUs."""
    if getattr(model, "hf_device_map", None) is None:
        yield
        return
    model._apply = lambda fn, recurse=True: model  # what Module.to and .cpu call on each child
    try:
        yield
    finally:
        del model._apply


def store(module: nn.Module) -> None:
    """Each tensor the hook of `module` offloads, as the module holds it now, into the hook's store:
    host memory (a state dict) or a `.dat` file in the offload folder, whose index entry then names
    it in place of the checkpoint's safetensors file (which is never written)."""
    from accelerate.utils import OffloadedWeightsLoader, PrefixedDataset, named_module_tensors, offload_weight

    hook = module._hf_hook
    weights = hook.weights_map
    prefix, loader = (weights.prefix, weights.dataset) if isinstance(weights, PrefixedDataset) else ("", weights)
    for name, tensor in named_module_tensors(module, include_buffers=hook.offload_buffers,
                                             recurse=hook.place_submodules, remove_non_persistent=True):
        key, value = prefix + name, tensor.detach().to("cpu")
        if not isinstance(loader, OffloadedWeightsLoader):
            loader[key] = value
        elif key in loader.state_dict:
            loader.state_dict[key] = value
        else:
            offload_weight(value, key, loader.save_folder, index=loader.index)


def onload_map(model: nn.Module, prefix: str, blocks: int, device: str) -> dict[str, str]:
    """accelerate's `device_map` for sequential onloading of `model` (built on `meta`; its `blocks`
    decoder blocks at `prefix`, introspection.transformer_blocks): the blocks in host memory (`cpu`)
    when `device` is an accelerator, in the checkpoint's files (`disk`) when `device` is the CPU;
    everything outside the blocks (embeddings, final norm, LM head) on `device`, where it runs for
    every block's calibration and every evaluated token."""
    away = "disk" if torch.device(device).type == "cpu" else "cpu"
    placement, path, parent = {}, "", model
    for part in prefix.split("."):
        for name, _ in parent.named_children():
            if name != part:
                placement[f"{path}{name}"] = device
        path, parent = f"{path}{part}.", getattr(parent, part)
    placement.update({f"{prefix}.{index}": away for index in range(blocks)})
    return placement


def meta_model(config) -> nn.Module:
    """The model a transformers config describes, on `meta`: its shapes without its weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Footprint:
    """What one job holds in memory, in bytes, from its model's shapes: `weights` (all of them),
    `block` (the largest decoder block), `outside` (what is not in a block: embeddings, norm, head),
    `activations` (the calibration hidden states held between blocks: each sample's input and
    output of a block, in the model's dtype) and `work` (the pruner's per-block statistics; `pruner`
    None: a dense job, which only evaluates)."""

    weights: int
    block: int
    outside: int
    activations: int
    work: int

    @classmethod
    def of(cls, model: nn.Module, blocks: list[nn.Module], dtype: torch.dtype, samples: int, seq_len: int,
           pruner) -> Footprint:
        """`model` on `meta` and its decoder `blocks`, at `dtype`."""
        size = torch.empty((), dtype=dtype).element_size()
        per_block = [sum(p.numel() for p in block.parameters()) * size for block in blocks]
        weights = sum(p.numel() for p in model.parameters()) * size
        hidden = model.config.get_text_config().hidden_size
        linears = [m for m in blocks[0].modules() if isinstance(m, nn.Linear)]
        return cls(weights=weights, block=max(per_block), outside=weights - sum(per_block),
                   activations=2 * samples * seq_len * hidden * size,
                   work=0 if pruner is None else pruner.block_work_bytes(
                       [(m.out_features, m.in_features) for m in linears], size))

    @property
    def onloaded(self) -> int:
        """On the device while onloading: what lives outside the blocks, one block with its pruned
        copy (a pruner's working copy, or the store's new version before the old one is released),
        the calibration activations and the pruner's statistics."""
        return self.outside + 2 * self.block + self.activations + self.work

    @property
    def whole(self) -> int:
        return self.weights + self.activations + self.work


def gb(size: int) -> str:
    return f"{size / 1e9:.3g} GB"


def free_bytes(device: str) -> int:
    """What `device` can still take: an accelerator's free memory, or the host's available memory."""
    import psutil

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def decide(onload: str, footprint: Footprint, budget: int, device: str) -> bool:
    """Whether a job onloads (`auto`: when its whole model does not fit `budget`); ValueError, naming
    the numbers, when it does not fit even one block at a time. `none` is not checked: a job runs
    whole, as it always has."""
    if onload == "none":
        return False
    onloads = onload == "sequential" or footprint.whole > budget
    need = footprint.onloaded
    if onloads and need > budget:
        raise ValueError(
            f"the job needs {gb(need)} on {device} even onloaded one block at a time: weights outside the blocks "
            f"{gb(footprint.outside)}, one block {gb(footprint.block)} (x2 while it is pruned), calibration "
            f"activations {gb(footprint.activations)}, the pruner's statistics {gb(footprint.work)}; the budget is "
            f"{gb(budget)} (pruning.memory_gb, or {device}'s free memory when null)")
    return onloads
