"""Dense against structurally pruned, side by side in one process: prefill and decode times from our
latency benchmark (bench=llm_generate), each pruned model timed in alternation with the dense one so
a change of machine load falls on both, and the physically smaller export reloaded and timed the
same way. A job's own `latency/speedup` divides by the dense median timed when the dense job ran,
which on a shared machine may be minutes earlier under another load; this script is the ratio to quote.

    python scripts/structured_latency.py --model smollm2-135m --pruners sleb,flap,llm_pruner \
        --sparsities 0.2,0.5 --rounds 3 -- data_dir=../shared/data calib=file calib.path=... calib.n_samples=4

Everything after `--` is Hydra overrides for every job (calibration, data_dir); the scores come from
the score cache when a sweep with the same calibration filled it."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from prunebench.pruning import prune
from prunebench.models.cache import get_model
from prunebench.export.folder import HFFolder, write_pretrained
from prunebench.paths import CONF_DIR


def timed(bench, loaded) -> tuple[float, float]:
    """(prefill s, decode s per token), medians over the bench's runs."""
    stats, _ = bench.measure(loaded)
    return stats["latency/prefill_s"], stats["latency/decode_per_token_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--pruners", default="sleb,layers_bi,slicegpt,flap,llm_pruner,width_amp")
    parser.add_argument("--sparsities", default="0.2,0.5")
    parser.add_argument("--rounds", type=int, default=3, help="dense / pruned / export alternations per model")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        base = [f"model={args.model}", "bench=llm_generate", f"bench.new_tokens={args.new_tokens}",
                f"bench.runs={args.runs}", "bench.warmup=2", *args.overrides]
        dense_cfg = compose("config", overrides=[*base, "pruner=none"])
        bench = instantiate({k: v for k, v in OmegaConf.to_container(dense_cfg.bench, resolve=True).items()
                             if k != "semi_structured"})
        dense = get_model(dense_cfg.model)
        rows = []
        for pruner in args.pruners.split(","):
            for sparsity in map(float, args.sparsities.split(",")):
                cfg = compose("config", overrides=[*base, f"pruner={pruner}", f"sparsity={sparsity}"])
                exporting = bool(instantiate(cfg.pruner, _convert_="all").exportable)
                pruned, _, stats, before = prune(cfg, False, HFFolder() if exporting else None)
                reloaded = None
                if exporting:
                    folder = Path(tempfile.mkdtemp(prefix=f"{pruner}-{sparsity}-"))
                    write_pretrained(pruned, folder, {}, before)
                    reloaded = get_model(compose("config", overrides=[*base, "model=hf_causal",
                                                                       f"model.path={folder}"]).model)
                times = {"dense": [], "pruned": [], "export": []}
                for _ in range(args.rounds):
                    for side, loaded in (("dense", dense), ("pruned", pruned), ("export", reloaded)):
                        if loaded is not None:
                            times[side].append(timed(bench, loaded))
                med = {side: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
                       for side, v in times.items() if v}
                row = {"pruner": pruner, "sparsity": sparsity, "params_removed": stats.get("sparsity/params", 0.0),
                       "dense_prefill_ms": 1e3 * med["dense"][0], "pruned_prefill_ms": 1e3 * med["pruned"][0],
                       "prefill_speedup": med["dense"][0] / med["pruned"][0],
                       "dense_decode_ms": 1e3 * med["dense"][1], "pruned_decode_ms": 1e3 * med["pruned"][1],
                       "decode_speedup": med["dense"][1] / med["pruned"][1],
                       "export_decode_speedup": med["dense"][1] / med["export"][1] if "export" in med else float("nan")}
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
                del pruned, reloaded
    print("\n| pruner | sparsity | params removed | prefill ms dense / pruned (x) | decode ms/token dense / pruned (x) "
          "| export decode (x) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pruner']} | {r['sparsity']:g} | {r['params_removed']:.1%} | {r['dense_prefill_ms']:.1f} / "
              f"{r['pruned_prefill_ms']:.1f} ({r['prefill_speedup']:.2f}x) | {r['dense_decode_ms']:.1f} / "
              f"{r['pruned_decode_ms']:.1f} ({r['decode_speedup']:.2f}x) | {r['export_decode_speedup']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
