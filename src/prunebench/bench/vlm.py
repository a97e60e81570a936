"""bench=vlm_generate: llm_generate's protocol (exactly `new_tokens` greedy tokens, batch 1,
warm-ups excluded, static KV cache, CUDA graph on CUDA) with one image before a short prompt, as a
vision-language model is used. The prefill runs the vision tower, the projector and the language
model over the image's positions and the prompt; each decode step reads the language model and
the LM head only, so the bandwidth floor counts those bytes and not the vision tower's."""

from __future__ import annotations

import numpy as np
import torch

from prunebench.bench.latency import GenerateBenchmark, weight_bytes_per_token
from prunebench.models.introspection import tower_parts
from prunebench.models.loaded import LoadedModel


def part_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class VisionLanguageGenerateBenchmark(GenerateBenchmark):
    """`image`: a picture file, or null for a seeded random picture (the processor resizes either to
    the tower's input, so its size changes nothing); `prompt`: the user turn's text."""

    families = frozenset({"vlm"})

    def __init__(self, name: str = "vlm_generate", prompt: str = "Describe the image.", image: str | None = None,
                 new_tokens: int = 128, batch_size: int = 1, warmup: int = 10, runs: int = 10,
                 cuda_graph: bool = True, seed: int = 0):
        if batch_size != 1:
            raise ValueError(f"bench.batch_size={batch_size}: vlm_generate times one image and prompt (batch 1)")
        if not prompt.strip():
            raise ValueError("bench.prompt is empty: give the short question asked about the image")
        super().__init__(name=name, prompt_tokens=1, new_tokens=new_tokens, batch_size=1, warmup=warmup,
                         runs=runs, cuda_graph=cuda_graph, seed=seed)
        self.prompt, self.image = prompt, image

    def key(self) -> tuple:
        return (*super().key(), self.prompt, self.image)

    def picture(self):
        if self.image is not None:
            return self.image
        from PIL import Image

        pixels = np.random.RandomState(self.seed).randint(0, 255, (336, 336, 3), dtype=np.uint8)
        return Image.fromarray(pixels)

    def prompt_inputs(self, loaded: LoadedModel) -> dict[str, torch.Tensor]:
        inputs = loaded.multimodal_inputs([loaded.chat_prompt(self.prompt, 1)], [[self.picture()]])
        inputs.pop("attention_mask", None)  # one unpadded row
        return {key: value.to(loaded.device) for key, value in inputs.items()}

    def read_bytes(self, model: torch.nn.Module, experts_per_token: float | None) -> float:
        parts = tower_parts(model)
        unread = sum(part_bytes(parts[p][1]) for p in ("vision", "projector") if p in parts)
        return weight_bytes_per_token(model, experts_per_token) - unread

    def protocol(self, positions: int) -> str:
        return f"1 image + prompt = {positions} in / " + super().protocol(positions).split(" in / ", 1)[1]
