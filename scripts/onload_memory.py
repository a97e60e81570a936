"""Peak host memory of a job pruning a model onloaded from disk, against the weights' bytes and one
block's, under a memory cap that the whole model breaks.

    nice -n 19 .venv/bin/python scripts/onload_memory.py [--layers 24 --hidden 1024 --intermediate 2816]

Builds a synthetic Llama (random fp32 weights, safetensors shards of about one block each, a
tokenizer trained in process) in a temporary folder, then runs whole jobs (prune, evaluate 5
multiple-choice documents, log to a throwaway MLflow store), each in a fresh process:
- the floor: the same onloaded job on a 2-block copy of the model (the libraries, Lightning, MLflow
  and two blocks), uncapped; its peak private memory (RssAnon) sets the cap;
- wanda and sparsegpt with pruning.onload=sequential, under a cap of the floor + `--margin` MB, less
  than the weights' bytes;
- the same wanda job with pruning.onload=none under that cap: the whole model must be loaded, and is not.

The cap is on private memory (RssAnon), what a cgroup's memory.max cannot reclaim: a watchdog reads
the job's /proc status every 10 ms and kills it above the cap. The checkpoint's pages that the job
has mapped (RssFile) are the page cache's, which the kernel drops under pressure; they are shown
apart. `ulimit -v` (RLIMIT_AS) and `ulimit -d` (RLIMIT_DATA) cannot serve: from_pretrained maps
every safetensors shard at once while it loads (transformers' modeling_utils, `safe_open(...,
backend="mmap")` per file), which both limits count in full though no page is read, so an onloaded
job under either fails in from_pretrained with a resident set of about 1.1 GB. Each line gives the
job's VmHWM (what a job logs as `memory/peak_host_gb`: private and mapped pages together) and the
sampled peaks of RssAnon and RssFile, in GB."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "mc_questions.jsonl"


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def build(folder: Path, layers: int, hidden: int, intermediate: int) -> dict:
    """The checkpoint, written block by block as shards of about one block; its bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prunebench.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    block = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    model.save_pretrained(folder, max_shard_size=f"{int(block * 1.05 / 1e6)}MB")
    tokenizer.save_pretrained(folder)
    generator = torch.Generator().manual_seed(0)  # many distinct tokens: SparseGPT's Hessians of full rank
    letters = "abcdefghijklmnopqrstuvwxyz ,.;:!?0123456789    "
    (folder.parent / "calib.txt").write_text(
        "".join(letters[i] for i in torch.randint(len(letters), (40000,), generator=generator).tolist()))
    return {"weights": sum(p.numel() * 4 for p in model.parameters()), "block": block}


def job(folder: str, pruner: str, onload: str, store: str) -> None:
    """One job in this process; prints its numbers as JSON on the last line."""
    from hydra import compose, initialize_config_dir

    from prunebench.job import run
    from prunebench.paths import CONF_DIR

    overrides = ["model=hf_causal", f"model.path={folder}", "model.name=synthetic", f"pruner={pruner}",
                 "sparsity=0.5", "task=local_mc", f"task.tasks.local_mc.source.path={FIXTURE}",
                 "calib=file", f"calib.path={Path(folder).parent / 'calib.txt'}", "calib.n_samples=8",
                 "calib.seq_len=128", f"pruning.onload={onload}",
                 f"tracking.uri=sqlite:///{store}/mlflow.db", "tracking.ensure_dense=false",
                 "tracking.skip_existing=false", "trainer.enable_progress_bar=false"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=overrides)
    try:
        metrics = run(cfg, overrides)
        out = {"ok": True, "acc": metrics["local_mc/acc"], "sparsity": metrics["sparsity/actual"],
               "peak_host_gb": metrics["memory/peak_host_gb"]}
    except BaseException as err:  # noqa: BLE001 (a capped job's failure is the measurement)
        while err.__cause__ is not None:  # the loader's own error, not Hydra's wrapping of it
            err = err.__cause__
        out = {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]}
    out.update(vm_hwm_gb=vm("VmHWM") / 1e9)
    print(json.dumps(out), flush=True)


def resident(pid: int) -> tuple[int, int]:
    """RssAnon and RssFile of process `pid`, in bytes (0 once it has gone)."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("RssAnon:", "RssFile:")):
                fields[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return fields.get("RssAnon", 0), fields.get("RssFile", 0)


def child(folder: Path, pruner: str, onload: str, cap: int | None) -> dict:
    # glibc's malloc raises its mmap threshold to the largest block freed (up to 32 MB), after which
    # each block's weights come from the heap and fragment it; a fixed threshold hands them back
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as store, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--job", str(folder), pruner, onload, store],
                                stdout=out, stderr=subprocess.DEVNULL, env=env, preexec_fn=lambda: os.nice(19))
        killed, anon_peak, file_peak = 0, 0, 0
        while proc.poll() is None:
            anon, mapped = resident(proc.pid)
            anon_peak, file_peak = max(anon_peak, anon), max(file_peak, mapped)
            if cap and anon > cap:
                proc.kill()
                killed = anon
            time.sleep(0.01)
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
    peaks = {"anon_gb": anon_peak / 1e9, "file_gb": file_peak / 1e9}
    if killed:
        return {"ok": False, "error": f"killed by the watchdog: private memory {killed / 1e9:.2f} GB over the cap", **peaks}
    if lines:
        return {**json.loads(lines[-1]), **peaks}
    return {"ok": False, "error": f"exit {proc.returncode} without a result", **peaks}


def line(name: str, result: dict, sizes: dict, floor: float) -> str:
    if not result["ok"]:
        return f"{name:<28} FAILED: {result['error']}"
    above = result["anon_gb"] * 1e9 - floor
    return (f"{name:<28} VmHWM {result['vm_hwm_gb']:5.2f} GB, private {result['anon_gb']:5.2f}, mapped "
            f"{result['file_gb']:5.2f}; private above the floor "
            f"{above / 1e9:5.3f} GB = {above / sizes['block']:4.2f} blocks = {above / sizes['weights']:4.2f} x the "
            f"weights; sparsity {result['sparsity']:.3f}, acc {result['acc']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--margin", type=int, default=600, help="MB of private memory above the floor's; 0: no cap")
    parser.add_argument("--job", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--keep", help="build the checkpoint in this folder and keep it")
    args = parser.parse_args()
    if args.job:
        return job(*args.job)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        sizes = build(Path(tmp) / "model", args.layers, args.hidden, args.intermediate)
        build(Path(tmp) / "floor", 2, args.hidden, args.intermediate)
        print(f"synthetic Llama: {args.layers} blocks, hidden {args.hidden}, MLP {args.intermediate}; fp32 weights "
              f"{sizes['weights'] / 1e9:.3f} GB, one block {sizes['block'] / 1e9:.4f} GB; calibration 8 x 128 tokens "
              f"(activations {2 * 8 * 128 * args.hidden * 4 / 1e6:.1f} MB)", flush=True)
        floor = child(Path(tmp) / "floor", "wanda", "sequential", None)
        floor_rss = floor["anon_gb"] * 1e9
        cap = floor_rss + args.margin * 1_000_000 if args.margin > 0 else None
        print(f"floor (the same job on 2 blocks, uncapped): VmHWM {floor['vm_hwm_gb']:.2f} GB, private "
              f"{floor['anon_gb']:.2f}, mapped {floor['file_gb']:.2f}", flush=True)
        if cap:
            print(f"cap: private memory <= {cap / 1e9:.2f} GB, {args.margin} MB above the floor's, less than the "
                  f"weights' {sizes['weights'] / 1e9:.2f} GB", flush=True)
        for pruner, onload in (("wanda", "sequential"), ("wanda", "none"), ("sparsegpt", "sequential")):
            result = child(Path(tmp) / "model", pruner, onload, cap)
            print(line(f"{pruner} onload={onload}", result, sizes, floor_rss), flush=True)


if __name__ == "__main__":
    main()
