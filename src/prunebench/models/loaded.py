from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoadedModel:
    """A model ready for pruning and evaluation, with what the evaluators need to know about it."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    family: str
    max_length: int
    info: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def placed(model: torch.nn.Module, device: str, device_map: str | dict | None) -> torch.nn.Module:
    """In eval mode, on `device` unless accelerate already placed it by `device_map`."""
    return (model if device_map else model.to(device)).eval()


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    valid = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in valid:
        raise ValueError(f"model.dtype={dtype!r} is not supported; use one of {sorted(valid)}")
    return valid[dtype]


def model_max_length(config, tokenizer, override: int | None = None) -> int:
    """The harness's rule (lm-eval HFLM.max_length): explicit value, else the config's position
    limit, else the tokenizer's, else 2048."""
    if override:
        return int(override)
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if value:
            return int(value)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < 1e29:
        return int(tok_max)
    return 2048
