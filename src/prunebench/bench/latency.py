"""Generation latency measured the way MoP reports it (12 prompt tokens, exactly 128 new tokens,
batch 1, warm-ups excluded), with the per-token overhead removed so pruning's savings show.

Eager generation spends most of a decode step launching kernels (27.7 ms/token against a 3.2 ms
bandwidth floor for a 7B model on an H200), so removing layers barely moves it. Here the decode step
runs against a static KV cache with on-device greedy argmax; on CUDA it is captured once in a CUDA
graph and replayed. `latency/floor_ratio` compares the decode time with the time to read every
weight once per token at the measured memory bandwidth."""

from __future__ import annotations

import logging
import statistics
import time

import torch

from prunebench.bench.environment import environment_tags, read_bandwidth, synchronize
from prunebench.models.experts import fused_experts, routed_top_k
from prunebench.models.loaded import LoadedModel

log = logging.getLogger(__name__)


def weight_bytes_per_token(model: torch.nn.Module, experts_per_token: float | None = None) -> float:
    """Bytes a batch-1 decode step reads: every parameter once, except an untied input embedding
    table, of which one row is read (a tied table is read whole by the LM head), and the routed
    experts, of which a token reads only those it is routed to: `experts_per_token` of each MoE
    layer's experts (measured, under top-p routing), else the router's top-k. Shared experts are
    plain MLPs and read whole."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or emb.weight.data_ptr() != head.weight.data_ptr():
        total -= emb.weight.numel() * emb.weight.element_size()
    routed = experts_per_token or routed_top_k(model)
    for module in model.modules():
        for param in fused_experts(module).values():
            n = param.shape[0]
            unread = 1 - min(routed or n, n) / n
            total -= unread * param.numel() * param.element_size()
    return total


class GreedyDecoder:
    """Prefill + a fixed number of greedy decode steps against a StaticCache."""

    def __init__(self, model, batch_size: int, prompt_tokens: int, new_tokens: int, cuda_graph: bool):
        from transformers import StaticCache

        self.model, self.new_tokens, self.prompt_tokens = model, new_tokens, prompt_tokens
        self.device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=prompt_tokens + new_tokens)
        self.ids = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.graph = None
        self.mode = "eager-static-cache"
        if cuda_graph and self.device.type == "cuda":
            self.mode = self._capture()

    def _step(self) -> torch.Tensor:
        logits = self.model(input_ids=self.ids, cache=self.cache, cache_position=self.position, use_cache=True,
                            logits_to_keep=1).logits
        return logits[:, -1].argmax(-1)

    def _capture(self) -> str:
        try:
            self.prefill(torch.zeros((self.ids.shape[0], self.prompt_tokens), dtype=torch.long, device=self.device))
            self.position.fill_(self.prompt_tokens)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.next_ids = self._step()
            return "cuda-graph-static-cache"
        except Exception as err:  # an architecture that cannot be captured still gets measured
            log.warning("CUDA graph capture failed (%s); timing the eager static-cache loop", err)
            self.graph = None
            return "eager-static-cache"

    def prefill(self, prompt: torch.Tensor, **inputs) -> torch.Tensor:
        """`inputs`: what else the prompt's forward takes (a vision-language model's pixel_values)."""
        self.cache.reset()
        positions = torch.arange(prompt.shape[1], device=self.device)
        logits = self.model(input_ids=prompt, cache=self.cache, cache_position=positions, use_cache=True,
                            logits_to_keep=1, **inputs).logits
        return logits[:, -1].argmax(-1)

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor, **inputs) -> tuple[torch.Tensor, float, float]:
        """(tokens [batch, new_tokens], total seconds, prefill seconds); never stops early."""
        synchronize(self.device)
        start = time.perf_counter()
        out = torch.empty((prompt.shape[0], self.new_tokens), dtype=torch.long, device=self.device)
        out[:, 0] = self.prefill(prompt, **inputs)
        synchronize(self.device)
        prefill_s = time.perf_counter() - start
        for i in range(1, self.new_tokens):
            self.ids.copy_(out[:, i - 1:i])
            self.position.fill_(self.prompt_tokens + i - 1)
            if self.graph is not None:
                self.graph.replay()
                out[:, i] = self.next_ids
            else:
                out[:, i] = self._step()
        synchronize(self.device)
        return out, time.perf_counter() - start, prefill_s


def summarize(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    q = statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1 else ordered * 9
    return {"median_s": statistics.median(ordered), "p10_s": q[0], "p90_s": q[-1], "mean_s": statistics.fmean(ordered)}


class GenerateBenchmark:
    """bench=llm_generate."""

    families = frozenset({"causal_lm", "moe", "vlm"})

    def __init__(self, name: str = "llm_generate", prompt_tokens: int = 12, new_tokens: int = 128,
                 batch_size: int = 1, warmup: int = 10, runs: int = 10, cuda_graph: bool = True, seed: int = 0):
        if new_tokens < 2 or prompt_tokens < 1 or runs < 1 or warmup < 0 or batch_size < 1:
            raise ValueError("bench: prompt_tokens >= 1, new_tokens >= 2, batch_size >= 1, runs >= 1, warmup >= 0")
        self.name, self.prompt_tokens, self.new_tokens = name, prompt_tokens, new_tokens
        self.batch_size, self.warmup, self.runs, self.cuda_graph, self.seed = batch_size, warmup, runs, cuda_graph, seed

    def key(self) -> tuple:
        return (self.prompt_tokens, self.new_tokens, self.batch_size, self.warmup, self.runs, self.cuda_graph)

    def prompt_inputs(self, loaded: LoadedModel) -> dict[str, torch.Tensor]:
        """The timed prompt: `input_ids` [batch, positions] and anything else its forward takes."""
        vocab = loaded.model.get_output_embeddings().weight.shape[0]
        return {"input_ids": torch.randint(0, vocab, (self.batch_size, self.prompt_tokens),
                                           generator=torch.Generator().manual_seed(self.seed)).to(loaded.device)}

    def read_bytes(self, model: torch.nn.Module, experts_per_token: float | None) -> float:
        """Bytes one decode step reads (the floor's numerator)."""
        return weight_bytes_per_token(model, experts_per_token)

    def protocol(self, positions: int) -> str:
        return f"{positions} in / {self.new_tokens} out / bs {self.batch_size} / {self.warmup} warm-up / {self.runs} timed"

    @torch.inference_mode()
    def measure(self, loaded: LoadedModel, experts_per_token: float | None = None
                ) -> tuple[dict[str, float], dict[str, str]]:
        model, device = loaded.model.eval(), loaded.device
        inputs = self.prompt_inputs(loaded)
        prompt = inputs.pop("input_ids")
        decoder = GreedyDecoder(model, self.batch_size, prompt.shape[1], self.new_tokens, self.cuda_graph)
        totals, decodes, prefills = [], [], []
        for i in range(self.warmup + self.runs):
            tokens, total, prefill = decoder.generate(prompt, **inputs)
            if i >= self.warmup:
                totals.append(total)
                prefills.append(prefill)
                decodes.append(total - prefill)
        self.last_tokens = tokens
        stats = {f"latency/{k}": v for k, v in summarize(totals).items()}
        decode_s = statistics.median(decodes)
        steps = self.new_tokens - 1  # the first new token comes out of the prefill
        bandwidth = read_bandwidth(device)
        floor = steps * self.read_bytes(model, experts_per_token) / bandwidth
        stats.update({"latency/decode_per_token_s": decode_s / steps, "latency/prefill_s": statistics.median(prefills),
                      "latency/floor_s": floor, "latency/floor_ratio": decode_s / floor,
                      "latency/bandwidth_gbs": bandwidth / 1e9,
                      "latency/tokens_per_s": self.batch_size * self.new_tokens / stats["latency/median_s"]})
        tags = {**environment_tags(device), "bench.mode": decoder.mode, "bench.protocol": self.protocol(prompt.shape[1])}
        return stats, tags
