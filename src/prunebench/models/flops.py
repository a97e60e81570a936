"""Forward FLOPs counted by torch.utils.flop_counter on one dummy input.

The input is a fake tensor (PyTorch's FakeTensorMode): every operator runs for its shapes only, so
counting costs no arithmetic and no activation memory (a 262k-vocabulary LM head's logits included).
Attention runs in eager mode while counting: the CPU's fused attention kernel is not in the
counter's registry, so its score and value matmuls would silently go uncounted."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from prunebench.cache import content_key
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


def forward_flops(loaded: LoadedModel, tokens: int = 128) -> dict[str, float]:
    """FLOPs of one forward pass over `tokens` positions (text, LM head included) divided by
    `tokens`, or of one image; a vision-language model's positions follow one image's. Values depend
    on `tokens` through attention, which grows with it. Counted once per architecture in a process
    (`architecture`): every structured job counts its dense model first, the same as the last job's."""
    key = architecture(loaded, tokens)
    if key not in COUNTED:
        COUNTED[key] = counted_flops(loaded, tokens)
    return dict(COUNTED[key])


COUNTED: dict[str, dict[str, float]] = {}


def architecture(loaded: LoadedModel, tokens: int) -> str:
    """What a count depends on: the model's class and config, its modules' types and every
    parameter's and buffer's name and shape (a pruner's cut shows in them), the family and `tokens`."""
    model = loaded.model
    config = getattr(model, "config", None)  # a timm model has none: its shapes say it all
    config = config.to_json_string() if hasattr(config, "to_json_string") else ""
    return content_key([type(model).__qualname__, config, loaded.family, tokens,
                        [type(m).__qualname__ for m in model.modules()],
                        [(n, list(t.shape)) for n, t in (*model.named_parameters(), *model.named_buffers())]])


@torch.no_grad()
def counted_flops(loaded: LoadedModel, tokens: int) -> dict[str, float]:
    counter = FlopCounterMode(display=False)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with eager_attention(loaded.model, attention_heads(loaded.model, "all")), fake, counter:
        if loaded.family == "vlm":
            return {"flops/per_token": image_prompt_flops(loaded.model, tokens, counter)}
        inputs, name, units = dummy_input(loaded, tokens)
        loaded.model(**{key: fake.from_tensor(value) for key, value in inputs.items()})
    return {name: counter.get_total_flops() / units}


def image_prompt_flops(model, tokens: int, counter: FlopCounterMode) -> float:
    """Per position of one image's positions followed by `tokens` of text: the vision tower and
    projector on one image, then the language model and LM head over all positions, fed as
    embeddings (LLaVA's forward checks image tokens against features by value, which fake tensors
    cannot give)."""
    config = model.config
    side, device = config.vision_config.image_size, next(model.parameters()).device
    model.get_image_features(pixel_values=torch.zeros((1, 3, side, side), device=device))
    positions = int(config.image_seq_length) + tokens
    model(inputs_embeds=torch.zeros((1, positions, config.text_config.hidden_size), device=device))
    return counter.get_total_flops() / positions
