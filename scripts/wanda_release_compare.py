"""Wanda beside its release: locuslab/wanda's `prune_wanda` (lib/prune.py, with lib/layerwrapper.py's
WrappedGPT), imported from a checkout the user gives and run unmodified, and prunebench's `wanda` on
two copies of SmolLM2-135M (fp32), fed the same calibration token windows; prints, per block, how
many mask entries differ, and both models' WikiText-2 test perplexity.

    PYTHONPATH=src .venv/bin/python scripts/wanda_release_compare.py --release /path/to/wanda \\
        [--sparsity 0.7] [--seed 0] [--norm-sum release] [--blocks N]

Calibration: `--nsamples` windows of `--seq-len` tokens of WikiText-2 validation
(`DATA/wikitext2/wiki.valid.raw`), cut by prunebench's calibration sampler (calib=file, `--seed`), the
protocol of docs/unstructured.md; perplexity: the first `--ppl-windows` windows of `--ppl-seq-len`
tokens of `DATA/wikitext2/wiki.test.raw`, prunebench's evaluation windows and NLL for both models.

What the release needs and this script supplies, none of it by editing the release's code:
- `lib/data.py` downloads C4; a module of that name is registered in its place before lib.prune is
  imported, whose `get_loaders` hands out the windows above (so both sides see the same tokens);
- `model.seqlen` and `model.hf_device_map` (set by the release's main.py and accelerate's loading);
- its `prepare_calibration_input` keeps each block's `attention_mask` and `position_ids` only, while
  transformers 4.48 and later want the rotary `position_embeddings` too: a forward pre-hook on each
  decoder block computes them from `position_ids` with the model's own rotary module when absent.
`--blocks N` keeps only the first N decoder blocks of both models (a quicker check; no perplexity)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import importlib.util
import io
import math
import platform
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"


def cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{name}, {torch.get_num_threads()} threads, {' '.join(simd) or 'no AVX2'}"


def release_commit(release: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(release), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def import_release(release: Path, windows: torch.Tensor):
    """The release's lib.prune, its package rooted at `release`/lib, with the data module replaced."""
    if not (release / "lib" / "prune.py").is_file() or not (release / "lib" / "layerwrapper.py").is_file():
        raise SystemExit(f"--release {release}: no lib/prune.py and lib/layerwrapper.py there "
                         "(a checkout of github.com/locuslab/wanda)")
    spec = importlib.machinery.ModuleSpec("lib", None, is_package=True)
    spec.submodule_search_locations = [str(release / "lib")]
    sys.modules["lib"] = importlib.util.module_from_spec(spec)

    data = types.ModuleType("lib.data")

    def get_loaders(name, nsamples=128, seed=0, seqlen=2048, tokenizer=None):
        if (nsamples, seqlen) != tuple(windows.shape):
            raise ValueError(f"the release asked for {nsamples} x {seqlen} windows; prepared: {tuple(windows.shape)}")
        return [(windows[i:i + 1], None) for i in range(nsamples)], None

    data.get_loaders = get_loaders
    sys.modules["lib.data"] = data
    return importlib.import_module("lib.prune")


def rotary_for_release(model) -> list:
    """Pre-hooks giving each decoder block the rotary embeddings the release's calls leave out."""
    rotary = model.model.rotary_emb

    def hook(module, args, kwargs):
        if kwargs.get("position_embeddings") is not None:
            return None
        hidden = args[0] if args else kwargs["hidden_states"]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
        return args, {**kwargs, "position_embeddings": rotary(hidden, positions)}

    return [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]


def keep_blocks(loaded, blocks: int | None) -> None:
    if blocks:
        model = loaded.model
        model.model.layers = model.model.layers[:blocks]
        model.config.num_hidden_layers = blocks


def masks_apart(ours, theirs) -> list[tuple[int, int]]:
    """Per block: (entries whose zero/nonzero state differs, entries) over its Linear weights."""
    out = []
    for mine, other in zip(ours.model.layers, theirs.model.layers):
        a = {n: m.weight for n, m in mine.named_modules() if isinstance(m, torch.nn.Linear)}
        b = {n: m.weight for n, m in other.named_modules() if isinstance(m, torch.nn.Linear)}
        out.append((sum(int(((a[n] == 0) != (b[n] == 0)).sum()) for n in a), sum(w.numel() for w in a.values())))
    return out


def perplexity(loaded, windows: torch.Tensor, batch: int = 4) -> float:
    from prunebench.evaluation.perplexity.engine import window_nll

    nll = torch.cat([window_nll(loaded, windows[i:i + batch]) for i in range(0, len(windows), batch)])
    return math.exp(float(nll.sum()) / (windows.shape[0] * (windows.shape[1] - 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of github.com/locuslab/wanda")
    parser.add_argument("--sparsity", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm-sum", default="release", help="prunebench's pruner.norm_sum (release or float64)")
    parser.add_argument("--nsamples", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--ppl-windows", type=int, default=16)
    parser.add_argument("--ppl-seq-len", type=int, default=512)
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--blocks", type=int, default=None, help="only the first N decoder blocks (no perplexity)")
    args = parser.parse_args()

    import transformers

    from prunebench.calibration import FileCalibration
    from prunebench.corpora import WikiText2
    from prunebench.evaluation.encoding import window_prefix
    from prunebench.evaluation.perplexity.windows import token_windows
    from prunebench.models.smollm2_gguf import load_smollm2_135m
    from prunebench.pruners.unstructured import WandaPruner

    print(f"release: {args.release.resolve()} at {release_commit(args.release)}")
    print(f"machine: {cpu_name()}; torch {torch.__version__}, transformers {transformers.__version__}")
    ours, theirs = (load_smollm2_135m(name="smollm2-135m") for _ in range(2))
    keep_blocks(ours, args.blocks)
    keep_blocks(theirs, args.blocks)
    calib = FileCalibration(str(args.data_dir / "wikitext2" / "wiki.valid.raw"), name="file",
                            n_samples=args.nsamples, seq_len=args.seq_len, seed=args.seed)
    windows = calib.samples(ours.tokenizer)
    print(f"calibration: {tuple(windows.shape)} windows of wikitext2 validation, seed {args.seed}; "
          f"sparsity {args.sparsity}; prunebench norm_sum={args.norm_sum}; "
          f"blocks {len(ours.model.model.layers)}")

    release = import_release(args.release, windows)
    model = theirs.model
    model.seqlen, model.hf_device_map = args.seq_len, {"": "cpu"}
    hooks = rotary_for_release(model)
    release_args = types.SimpleNamespace(nsamples=args.nsamples, seed=args.seed, sparsity_ratio=args.sparsity,
                                         use_variant=False)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its line per pruned matrix
        release.prune_wanda(release_args, model, theirs.tokenizer, device=torch.device("cpu"))
    print(f"release prune_wanda: {time.perf_counter() - start:.0f} s")
    for hook in hooks:
        hook.remove()

    class Windows:  # the very windows the release got
        def samples(self, tokenizer):
            return windows

    pruner = WandaPruner(norm_sum=args.norm_sum)
    start = time.perf_counter()
    pruner.apply(ours, pruner.score(ours, Windows()), args.sparsity)
    print(f"prunebench wanda: {time.perf_counter() - start:.0f} s")

    apart = masks_apart(ours.model, theirs.model)
    for index, (diff, total) in enumerate(apart):
        print(f"block {index:2d}: {diff:>8,} of {total:,} mask entries apart ({100 * diff / total:.4f}%)")
    diff, total = sum(d for d, _ in apart), sum(t for _, t in apart)
    print(f"all blocks: {diff:,} of {total:,} apart ({100 * diff / total:.4f}%)")
    if args.blocks:
        return
    text = WikiText2("test", str(args.data_dir)).text()
    ids = ours.tokenizer.encode(text, add_special_tokens=False)
    test = token_windows(ids, args.ppl_seq_len, window_prefix(ours.tokenizer))[:args.ppl_windows]
    print(f"wikitext2 test perplexity, {len(test)} x {args.ppl_seq_len} tokens: "
          f"release {perplexity(theirs, test):.2f}, prunebench {perplexity(ours, test):.2f}")


if __name__ == "__main__":
    main()
