"""Forward FLOPs counted by torch.utils.flop_counter on one dummy input.

The input is a fake tensor (PyTorch's FakeTensorMode): every operator runs for its shapes only, so
counting costs no arithmetic and no activation memory (a 262k-vocabulary LM head's logits included).
Attention runs in eager mode while counting: the CPU's fused attention kernel is not in the
counter's registry, so its score and value matmuls would silently go uncounted."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from prunebench.models.attention import attention_heads, eager_attention
from prunebench.models.loaded import LoadedModel


def dummy_input(loaded: LoadedModel, tokens: int) -> tuple[dict, str, int]:
    """(forward kwargs, metric name, how many units the FLOPs are divided by)."""
    device = loaded.device
    if loaded.family == "vision":
        from timm.data import resolve_model_data_config

        size = getattr(getattr(loaded.model, "patch_embed", None), "img_size", None)
        size = tuple(size) if size else resolve_model_data_config(loaded.model)["input_size"][1:]
        return {"x": torch.zeros((1, 3, *size), device=device)}, "flops/per_image", 1
    return {"input_ids": torch.zeros((1, tokens), dtype=torch.long, device=device)}, "flops/per_token", tokens


@torch.no_grad()
def forward_flops(loaded: LoadedModel, tokens: int = 128) -> dict[str, float]:
    """FLOPs of one forward pass over `tokens` positions (text, LM head included) divided by
    `tokens`, or of one image. Values depend on `tokens` through attention, which grows with it."""
    inputs, name, units = dummy_input(loaded, tokens)
    counter = FlopCounterMode(display=False)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with eager_attention(loaded.model, attention_heads(loaded.model)), fake, counter:
        loaded.model(**{key: fake.from_tensor(value) for key, value in inputs.items()})
    return {name: counter.get_total_flops() / units}
