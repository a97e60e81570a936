"""bench=vision: batch-1 latency and batch-N throughput of an image model at its own input size."""

from __future__ import annotations

import time

import torch

from prunebench.bench.environment import environment_tags, synchronize
from prunebench.bench.latency import summarize
from prunebench.models.loaded import LoadedModel


class VisionBenchmark:
    families = frozenset({"vision"})

    def __init__(self, name: str = "vision", throughput_batch: int = 32, warmup: int = 10, runs: int = 20):
        if throughput_batch < 1 or runs < 1 or warmup < 0:
            raise ValueError("bench: throughput_batch >= 1, runs >= 1, warmup >= 0")
        self.name, self.throughput_batch, self.warmup, self.runs = name, throughput_batch, warmup, runs

    def key(self) -> tuple:
        return (self.throughput_batch, self.warmup, self.runs)

    def _times(self, model, images: torch.Tensor) -> list[float]:
        out = []
        for i in range(self.warmup + self.runs):
            synchronize(images.device)
            start = time.perf_counter()
            model(images)
            synchronize(images.device)
            if i >= self.warmup:
                out.append(time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def measure(self, loaded: LoadedModel) -> tuple[dict[str, float], dict[str, str]]:
        from timm.data import resolve_model_data_config

        model, device = loaded.model.eval(), loaded.device
        size = resolve_model_data_config(model)["input_size"]
        single = summarize(self._times(model, torch.randn((1, *size), device=device)))
        batch = summarize(self._times(model, torch.randn((self.throughput_batch, *size), device=device)))
        metrics = {f"latency/{k}": v for k, v in single.items()}
        metrics["throughput/images_per_s"] = self.throughput_batch / batch["median_s"]
        return metrics, {**environment_tags(device), "bench.protocol":
                         f"{tuple(size)} images / bs 1 latency, bs {self.throughput_batch} throughput / "
                         f"{self.warmup} warm-up / {self.runs} timed"}
