"""Dense vs structurally pruned variants of a LLaMA-2-7B-shaped random-weight model: median
generation latency (MoP protocol), bandwidth floor, floor ratio and speedup, as one table.

Random weights are enough: latency depends on shapes, not values. Each pruned variant is built at
the shape the pruner produces (25% of layers, of heads, of MLP width removed), plus the dense shape
with 2:4 sparse kernels. `--shape tiny` runs the same code on the CPU in seconds (used by the tests).

    python scripts/gpu_latency.py            # on a GPU machine with only the repo: < 5 minutes
"""

from __future__ import annotations

import argparse
import time

import torch

from prunebench.bench import semi_structured
from prunebench.bench.latency import GenerateBenchmark
from prunebench.models.loaded import LoadedModel

SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, head_dim=128, vocab_size=32000),
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=8, head_dim=16, vocab_size=512),
}


def variants(base: dict) -> dict[str, dict]:
    quarter = lambda n: n - n // 4  # noqa: E731
    return {
        "dense": base,
        "layers -25%": {**base, "num_hidden_layers": quarter(base["num_hidden_layers"])},
        "heads -25%": base,  # sliced after building: configs insist on hidden % heads == 0
        "width -25%": {**base, "intermediate_size": quarter(base["intermediate_size"])},
        "2:4 sparse": base,
    }


def slice_heads(model: torch.nn.Module, keep_fraction: float = 0.75) -> None:
    """Physically remove the last heads of every layer (q, k, v rows and o columns), as a head
    pruner's slicing does; the cache sizes itself from the keys it receives."""
    from transformers.pytorch_utils import prune_linear_layer

    cfg = model.config
    keep = torch.arange(int(cfg.num_attention_heads * keep_fraction) * cfg.head_dim)
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_proj, attn.k_proj, attn.v_proj = (prune_linear_layer(p, keep.to(p.weight.device), dim=0)
                                                 for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        attn.o_proj = prune_linear_layer(attn.o_proj, keep.to(attn.o_proj.weight.device), dim=1)


def prune_2_4(model: torch.nn.Module) -> None:
    """Keep the 2 largest |w| of every 4 consecutive input weights of each block Linear."""
    from prunebench.models.introspection import block_linears

    with torch.no_grad():
        for linear in block_linears(model).values():
            groups = linear.weight.view(-1, 4)
            drop = groups.abs().topk(2, dim=1, largest=False).indices
            groups.scatter_(1, drop, 0)


def build(shape: dict, device: str, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", max_position_embeddings=4096, **shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return LoadedModel(model=model, tokenizer=None, name="llama-shaped", family="causal_lm", max_length=4096)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    bench = GenerateBenchmark(new_tokens=args.new_tokens, warmup=args.warmup, runs=args.runs)
    rows, dense_median = [], None
    for name, shape in variants(SHAPES[args.shape]).items():
        start = time.perf_counter()
        loaded = build(shape, args.device, dtype)
        note = ""
        if name == "heads -25%":
            slice_heads(loaded.model)
        if name == "2:4 sparse":
            prune_2_4(loaded.model)
            why_not = semi_structured.supported(loaded.device)
            note = why_not or f"{semi_structured.to_semi_structured(loaded.model)} sparse layers"
        metrics, tags = bench.measure(loaded)
        dense_median = dense_median or metrics["latency/median_s"]
        rows.append({"variant": name, "median_s": metrics["latency/median_s"],
                     "decode_ms_per_token": 1e3 * metrics["latency/decode_per_token_s"],
                     "floor_ms_per_token": 1e3 * metrics["latency/floor_s"] / (args.new_tokens - 1),
                     "floor_ratio": metrics["latency/floor_ratio"], "speedup": dense_median / metrics["latency/median_s"],
                     "mode": tags["bench.mode"], "note": note, "build_and_time_s": time.perf_counter() - start})
        del loaded
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"# {args.shape}-shaped llama, {tags['bench.device_name']}, {tags['bench.protocol']}, "
          f"read bandwidth {metrics['latency/bandwidth_gbs']:.0f} GB/s")
    print("| variant | median s | decode ms/token | floor ms/token | floor ratio | speedup | mode | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['median_s']:.4f} | {r['decode_ms_per_token']:.3f} | {r['floor_ms_per_token']:.3f} "
              f"| {r['floor_ratio']:.2f} | {r['speedup']:.2f} | {r['mode']} | {r['note']} |")
    return rows


if __name__ == "__main__":
    main()
