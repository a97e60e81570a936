"""What pruners, engines and benchmarks ask of a model's structure: its repeated blocks, their
linear layers, its parameter count, and the one forward that takes a batch of any model's inputs."""

from __future__ import annotations

import torch


def model_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    if "pixel_values" in batch:  # timm models take the image tensor positionally, and no labels
        return model(batch["pixel_values"])
    return model(**batch)


def transformer_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The repeated blocks (decoder layers, encoder layers): the ModuleList as long as the
    config's layer count. Embeddings and heads live outside it and are never pruned.

    A composite model (a vision-language model: `config.text_config`) is pruned in its language
    model, whose layer count the text config holds; its vision tower's blocks are left alone."""
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None)
    n_layers = getattr(text_config or config, "num_hidden_layers", None)
    lists = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers]
    if text_config is not None:
        # the language model's blocks, not a vision tower that happens to have as many
        lists = [(name, module) for name, module in lists if "vision" not in name] or lists
    if lists:
        return lists[0]
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
    """All parameters, or only those not zero (what unstructured pruning leaves)."""
    if nonzero:
        return sum(int(torch.count_nonzero(p)) for p in module.parameters())
    return sum(p.numel() for p in module.parameters())
