"""What pruners, engines and benchmarks ask of a model's structure: its repeated blocks, their
linear layers, its parameter count, and the one forward that takes a batch of any model's inputs."""

from __future__ import annotations

from contextlib import nullcontext

import torch


# which parts of a vision-language model a pruner acts on: its language model, its vision tower, or both
TOWERS = ("language", "vision", "all")
# where LLaVA-style checkpoints keep their vision tower and their projector (transformers' names)
VISION_TOWER_NAMES = ("vision_tower", "vision_model", "visual")
PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector")


def is_composite(model: torch.nn.Module) -> bool:
    """A vision-language model: its config holds a text config and a vision config."""
    config = getattr(model, "config", None)
    return getattr(config, "text_config", None) is not None and getattr(config, "vision_config", None) is not None


def _named_part(model: torch.nn.Module, leaves: tuple[str, ...]) -> tuple[str, torch.nn.Module] | None:
    return next(((name, module) for name, module in model.named_modules() if name.rpartition(".")[2] in leaves), None)


def tower_parts(model: torch.nn.Module) -> dict[str, tuple[str, torch.nn.Module]]:
    """{"language" | "vision" | "projector": (name in the model, module)}. A model that is not a
    vision-language model is one tower, "language"."""
    if not is_composite(model):
        return {"language": ("", model)}
    decoder = model.get_decoder()
    parts = {"language": next((name, m) for name, m in model.named_modules() if m is decoder)}
    for part, leaves in (("vision", VISION_TOWER_NAMES), ("projector", PROJECTOR_NAMES)):
        found = _named_part(model, leaves)
        if found is not None:
            parts[part] = found
    return parts


def tower_modules(model: torch.nn.Module, tower: str = "language") -> list[tuple[str, torch.nn.Module]]:
    """The (name, module) roots a pruner with `tower` searches: the language model, the vision
    tower, or every tower there is (vision first, its forward order). The projector is in none."""
    if tower not in TOWERS:
        raise ValueError(f"tower={tower!r}; valid: {list(TOWERS)}")
    parts = tower_parts(model)
    wanted = [t for t in ("vision", "language") if t in parts] if tower == "all" else [tower]
    missing = [t for t in wanted if t not in parts]
    if missing:
        raise ValueError(f"{type(model).__name__} has no {missing[0]} tower prunebench can find "
                         f"(towers found: {sorted(parts)})")
    return [parts[t] for t in wanted]


def tower_config(model: torch.nn.Module, tower: str):
    """The config that states a tower's shapes: the text or vision config of a composite model, else its own."""
    config = getattr(model, "config", None)
    if config is None or not is_composite(model):
        return config
    return config.text_config if tower == "language" else config.vision_config


def model_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    if "pixel_values" in batch and "input_ids" not in batch:  # timm models take the image tensor positionally, and no labels
        return model(batch["pixel_values"])
    return model(**batch)


def transformer_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The repeated blocks (decoder layers, encoder layers) of the language tower: the ModuleList as
    long as the config's layer count. Embeddings and heads live outside it and are never pruned.

    A composite model (a vision-language model) is searched in its language model only, whose layer
    count the text config holds: a vision tower with as many layers is never taken for it."""
    (root_name, root), = tower_modules(model, "language")
    n_layers = getattr(tower_config(model, "language"), "num_hidden_layers", None)
    prefix = f"{root_name}." if root_name else ""
    for name, module in root.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return prefix + name, module
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} "
                     f"(no ModuleList of num_hidden_layers={n_layers})")


def block_linears(model: torch.nn.Module, skip_layers=()) -> dict[str, torch.nn.Linear]:
    prefix, blocks = transformer_blocks(model)
    out = {}
    for idx, block in enumerate(blocks):
        if idx in set(skip_layers):
            continue
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear):
                out[f"{prefix}.{idx}.{name}"] = module
    return out


def count_parameters(module: torch.nn.Module, nonzero: bool = False) -> int:
    """All parameters, or only those not zero (what unstructured pruning leaves; an offloaded
    module's counted on its device, one module at a time: models/offload.py)."""
    from prunebench.models.offload import has_offloaded_params, onloaded

    if nonzero:
        total = 0
        for m in module.modules():  # each module's own tensors: an offloaded one's alone on the device
            with onloaded(m, edits=False) if has_offloaded_params(m) else nullcontext():
                total += sum(int(torch.count_nonzero(p)) for p in m.parameters(recurse=False))
        return total
    return sum(p.numel() for p in module.parameters())
