"""Image classifiers from timm, by architecture name: hub weights (`pretrained`), a local
checkpoint (`checkpoint_path`), or random (tests); `num_classes` resizes the head."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel, resolve_dtype


def load_timm(*, name: str, arch: str, pretrained: bool = False, checkpoint_path: str | None = None,
              num_classes: int | None = None, kwargs: dict | None = None, family: str = "vision", seed: int = 0,
              dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    import timm

    options = dict(kwargs or {})
    if num_classes is not None:
        options["num_classes"] = num_classes
    torch.manual_seed(seed)  # random weights (pretrained=false, no checkpoint) are reproducible
    model = timm.create_model(arch, pretrained=pretrained, checkpoint_path=checkpoint_path or "", **options)
    model = model.to(device=device, dtype=resolve_dtype(dtype)).eval()
    return LoadedModel(model=model, tokenizer=None, name=name, family=family, max_length=0)
