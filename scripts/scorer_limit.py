"""prunebench's loglikelihood scorer against the limit of an exact scorer, in one process, on the same
model object, dtype and documents (the lm-eval bridge's requests).

The limit: an exact prefix-sharing scorer cannot avoid one body forward over every distinct token
(the nodes of the trie of all fed sequences: a document's shared context once, a few-shot stem its
documents share once, then each continuation's own tokens) and the LM head, with the full-vocabulary
log-sum-exp an exact log-probability needs, at every distinct scored position. The bench times
exactly that: the distinct tokens packed densely (no padding) into the fastest of a few batch shapes,
through the decoder alone (`model(input_ids)` without the head), then the head at the scored
positions in the fastest of a few blockings. Its rows attend causally within themselves rather than
to their own contexts; the search takes the fastest shape, so the limit is if anything too fast.

Ours: the bridge's evaluation as a job runs it (tokenising lm-eval's requests, batching, scoring,
lm-eval's process_results and metrics in the Lightning test loop), model load and lm-eval's own
request building (`build_all_requests`, the same in lm-eval's evaluate; timed apart) excluded.
Rounds alternate ours and the limit; each side's minimum is taken, of wall and of CPU seconds
(with one thread on a machine others load, CPU seconds are the steadier measure).

FLOPs are the necessary work's, the same numerator for both sides: 2 x the decoder's non-embedding
parameters x distinct tokens, plus attention (QK^T and AV at each token's own span, its sliding
window where the layer has one), plus 2 x hidden x vocabulary per scored position. The matmul peak is
a `torch.matmul` probe at the dtype and thread count of the run, on shapes the size of the model's.

    PYTHONPATH=src .venv/bin/python scripts/scorer_limit.py model=gemma3-270m data_dir=../shared/data limit=50 \\
        --tasks arc_challenge,hellaswag,winogrande,mmlu:5 --dtypes float32,bfloat16 --threads 2 --out limit.json

`--tasks`: as scripts/lm_eval_tasks.py (`name:k` for k-shot); `--limits mmlu=2` sets one task's
documents (per MMLU subject: lm-eval's --limit). HellaSwag's original jsonl is absent from
../shared/data: then its llama.cpp jsonl view is read in its place (an overlay folder of links)."""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import tempfile
import time
from pathlib import Path

import torch
from lightning import Trainer

from lm_eval_tasks import bridge_tasks
from prunebench.evaluation.loglikelihood import engine as loglikelihood, scorer as loglik
from prunebench.evaluation.head import token_logprobs
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model

BODY_SHAPES = [(rows, length) for budget in (2048, 8192) for length in (128, 256, 512) if (rows := budget // length)]
HEAD_ROWS = (64, 256, 1024)


def hellaswag_overlay(data_dir: Path) -> Path:
    """data_dir itself, or when it lacks HellaSwag's original jsonl, a folder of links to its entries
    with hellaswag/hellaswag_val.jsonl naming the llama.cpp jsonl view (the layout's reader reads both)."""
    if (data_dir / "hellaswag/hellaswag_val.jsonl").is_file():
        return data_dir
    overlay = Path(tempfile.mkdtemp(prefix="scorer_limit_data_"))
    for entry in data_dir.iterdir():
        if entry.name != "hellaswag":
            (overlay / entry.name).symlink_to(entry.resolve())
    (overlay / "hellaswag").mkdir()
    (overlay / "hellaswag/hellaswag_val.jsonl").symlink_to((data_dir / "hellaswag/hellaswag_val_llamacpp.jsonl").resolve())
    print(f"HellaSwag: {data_dir}/hellaswag/hellaswag_val.jsonl is absent; reading hellaswag_val_llamacpp.jsonl")
    return overlay


def distinct_work(docs) -> dict:
    """The trie of every fed sequence: its nodes are the distinct tokens (with the position each sits
    at), the nodes ending a scored position's prefix the distinct scored positions."""
    root: dict = {}
    positions: list[int] = []
    scored: set[int] = set()
    for doc in docs:
        for seq, clen in zip(doc.inputs, doc.cont_lens):
            node = root
            for p, token in enumerate(seq):
                if token not in node:
                    node[token] = {}
                    positions.append(p)
                node = node[token]
                if p >= len(seq) - clen:
                    scored.add(id(node))
    return {"positions": positions, "scored": len(scored), "tokens": sum(len(s) for d in docs for s in d.inputs)}


def attention_spans(config, positions: list[int]) -> int:
    """Keys attended summed over layers and tokens: each token its position + 1, capped by a sliding
    layer's window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    full = sum(p + 1 for p in positions)
    sliding = sum(min(p + 1, window) for p in positions) if window else full
    return sum(sliding if kind == "sliding_attention" else full for kind in types)


def necessary_flops(loaded, work: dict) -> float:
    """Counted by hand rather than by torch's FlopCounter: the work's tokens sit at their own
    positions, which no one dense forward has."""
    config = loaded.model.config.get_text_config()
    decoder = loaded.decoder()
    embed = decoder.get_input_embeddings().weight.numel()
    body = sum(p.numel() for p in decoder.parameters()) - embed
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_attention_heads * head_dim * attention_spans(config, work["positions"])
    return 2 * body * len(work["positions"]) + attention + 2 * config.hidden_size * loaded.vocab_size * work["scored"]


def timed(function):
    start, cpu = time.perf_counter(), time.process_time()
    out = function()
    return out, time.perf_counter() - start, time.process_time() - cpu


@torch.inference_mode()
def body_forwards(loaded, tokens: int, shape: tuple[int, int]) -> None:
    """`tokens` positions in dense [rows, length] batches (the last with as few rows as cover it)."""
    rows, length = shape
    decoder = loaded.decoder()
    for start in range(0, tokens, rows * length):
        n = -(-min(rows * length, tokens - start) // length)
        ids = torch.randint(1, loaded.vocab_size, (n, length))
        decoder(input_ids=ids.to(loaded.device), use_cache=False)


@torch.inference_mode()
def bare_head(loaded, hidden: torch.Tensor, targets: torch.Tensor, rows: int) -> None:
    """The head over the whole vocabulary `rows` positions at a time: log-sum-exp in fp32, the target's
    logit and the row max (the greedy test)."""
    for start in range(0, len(hidden), rows):
        logits = loaded.lm_logits(hidden[start:start + rows]).float()
        part = targets[start:start + rows]
        logits.gather(1, part[:, None])[:, 0] - logits.logsumexp(-1)
        logits.amax(-1)


def head_candidates(loaded, scored: int):
    dtype = next(loaded.model.parameters()).dtype
    hidden = torch.randn(scored, loaded.model.config.get_text_config().hidden_size, dtype=dtype, device=loaded.device)
    targets = torch.randint(0, loaded.vocab_size, (scored,), device=loaded.device)
    out = {f"full vocab x {rows} rows": (lambda rows=rows: bare_head(loaded, hidden, targets, rows)) for rows in HEAD_ROWS}
    out["blocked (head.py)"] = lambda: torch.inference_mode()(token_logprobs)(loaded, hidden, targets)
    return out


class Limit:
    """The limit's work for one task. The first call searches the body's batch shape and the head's
    blocking on a sample of the work (up to 2048 tokens, 256 scored positions; each candidate warmed
    up, best of 2), every call runs the fastest of each on the whole work: (wall s, CPU s) of body
    and head."""

    def __init__(self, loaded, work: dict):
        self.loaded, self.work = loaded, work
        self.body_shape = self.head = None

    def search(self) -> None:
        tokens = min(len(self.work["positions"]), 2048)
        body = {f"{rows}x{length}": lambda s=(rows, length): body_forwards(self.loaded, tokens, s)
                for rows, length in BODY_SHAPES}
        heads = head_candidates(self.loaded, min(self.work["scored"], 256))
        times = {key: (run(), min(timed(run)[1] for _ in range(2)))[1] for key, run in [*body.items(), *heads.items()]}
        self.body_shape = tuple(map(int, min(body, key=times.get).split("x")))
        self.head = min(heads, key=times.get)
        print(f"    limit search ({tokens} tokens, {min(self.work['scored'], 256)} scored): "
              f"{', '.join(f'{k} {t:.2f}s' for k, t in times.items())}",
              flush=True)

    def __call__(self) -> tuple[float, float, float, float]:
        if self.body_shape is None:
            self.search()
        _, body_s, body_cpu = timed(lambda: body_forwards(self.loaded, len(self.work["positions"]), self.body_shape))
        _, head_s, head_cpu = timed(head_candidates(self.loaded, self.work["scored"])[self.head])
        return body_s, head_s, body_cpu, head_cpu


def matmul_peak(dtype: torch.dtype, hidden: int, intermediate: int) -> float:
    """FLOP/s of the fastest of square and MLP-shaped matmuls at the dtype (best of 5 each)."""
    best = 0.0
    for m, k, n in [(1024, 1024, 1024), (2048, 2048, 2048), (2048, hidden, intermediate), (2048, intermediate, hidden)]:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.matmul(a, b)
        for _ in range(5):
            _, wall, _ = timed(lambda: torch.matmul(a, b))
            best = max(best, 2 * m * k * n / wall)
    return best


class Probe:
    """Where ours spends its time, by wrapping the scorer's stages for one round: the decoder's
    forwards (and their padded positions), the LM head, score_documents as a whole, tokenising."""

    def __init__(self, loaded):
        self.loaded, self.seconds, self.positions, self.forwards = loaded, {}, 0, 0
        self._wraps = [(loglik, "token_logprobs", "head"), (loglikelihood, "score_documents", "score_documents"),
                       (loglikelihood.LoglikelihoodDataModule, "setup", "tokenise + batch")]

    def _wrap(self, name, function):
        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        return wrapped

    def __enter__(self):
        self._saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in self._wraps]
        for (owner, attr, name), (_, _, function) in zip(self._wraps, self._saved):
            setattr(owner, attr, self._wrap(name, function))
        decoder = self.loaded.decoder()
        self._forward = decoder.forward

        def forward(*args, **kwargs):
            self.positions += kwargs["input_ids"].numel()
            self.forwards += 1
            return self._wrap("body", self._forward)(*args, **kwargs)
        decoder.forward = forward
        return self

    def __exit__(self, *exc):
        for owner, attr, function in self._saved:
            setattr(owner, attr, function)
        del self.loaded.decoder().forward


def ours(cfg, loaded, task, accelerator: str, limit):
    def evaluate():
        data, module = evaluation(task, loaded, limit, cfg.eval)
        Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False).test(module, datamodule=data, verbose=False)
        return data
    return timed(evaluate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (model=..., data_dir=..., limit=...)")
    parser.add_argument("--tasks", default="arc_challenge,hellaswag,winogrande,mmlu:5")
    parser.add_argument("--limits", default="", help="per-task documents: name=N,... (else the limit= override)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of ours and the limit")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--profile", type=Path, default=None, help="write cProfile stats of one round of ours per task here")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # its per-run GPU/TPU lines and tips
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides)
    for i, item in enumerate(overrides):
        if item.startswith("data_dir="):
            overrides[i] = f"data_dir={hellaswag_overlay(Path(item.split('=', 1)[1]).expanduser())}"
    limits = dict(item.split("=") for item in args.limits.split(",") if item)
    cfg, tasks = bridge_tasks(args.tasks, overrides)
    rows = []
    for dtype in args.dtypes.split(","):
        cfg.model.dtype = dtype
        loaded = get_model(cfg.model)
        accelerator = "gpu" if loaded.device.type == "cuda" else "cpu"
        text = loaded.model.config.get_text_config()
        peak = matmul_peak(getattr(torch, dtype), text.hidden_size, getattr(text, "intermediate_size", 4 * text.hidden_size))
        print(f"{dtype}: matmul peak {peak / 1e9:.1f} GFLOP/s ({torch.get_num_threads()} threads)", flush=True)
        for name, task in tasks.items():
            limit = int(limits[name]) if name in limits else cfg.get("limit")
            documents, requests_s, _ = timed(lambda: task.instances(limit))
            task.instances = lambda _limit=None, documents=documents: documents  # built once: lm-eval's part
            with Probe(loaded) as probe:  # warm-up, the documents' requests, and where ours spends its time
                data, probe_s, _ = ours(cfg, loaded, task, accelerator, limit)
            docs = [doc for batch in data.batches for doc in batch]
            work = distinct_work(docs)
            flops = necessary_flops(loaded, work)
            limit_run = Limit(loaded, work)
            limit_run.search()
            ours_s, ours_cpu, limit_s = [], [], []
            for _ in range(args.rounds):
                _, wall, cpu = ours(cfg, loaded, task, accelerator, limit)
                ours_s.append(wall)
                ours_cpu.append(cpu)
                limit_s.append(limit_run())
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                profiler = cProfile.Profile()
                profiler.runcall(ours, cfg, loaded, task, accelerator, limit)
                pstats.Stats(profiler).dump_stats(args.profile / f"{name}-{dtype}.prof")
            body_s, head_s, _, _ = min(limit_s, key=lambda t: t[0] + t[1])
            limit_cpu = min(b + h for _, _, b, h in limit_s)
            row = {"task": name, "docs": len(docs), "dtype": dtype, "ours_s": min(ours_s), "ours_cpu_s": min(ours_cpu),
                   "limit_s": body_s + head_s, "limit_body_s": body_s, "limit_head_s": head_s, "limit_cpu_s": limit_cpu,
                   "ratio": min(ours_s) / (body_s + head_s), "ratio_cpu": min(ours_cpu) / limit_cpu,
                   "requests_s": requests_s,
                   "fed_tokens": work["tokens"], "distinct_tokens": len(work["positions"]),
                   "scored_positions": work["scored"], "ours_positions": probe.positions, "ours_forwards": probe.forwards,
                   "gflop": flops / 1e9, "gflops_ours": flops / min(ours_s) / 1e9,
                   "gflops_limit": flops / (body_s + head_s) / 1e9, "peak_gflops": peak / 1e9,
                   "limit_body_shape": limit_run.body_shape, "limit_head": limit_run.head,
                   "ours_profile_s": {"total": probe_s, **probe.seconds}}
            rows.append(row)
            stages = ", ".join(f"{k} {v:.2f}" for k, v in row["ours_profile_s"].items())
            print(f"  {name}: {len(docs)} docs, ours {row['ours_s']:.2f} s (CPU {row['ours_cpu_s']:.2f}), limit "
                  f"{row['limit_s']:.2f} s (body {body_s:.2f} + head {head_s:.2f}; CPU {limit_cpu:.2f}), ratio "
                  f"{row['ratio']:.2f}x (CPU {row['ratio_cpu']:.2f}x); "
                  f"positions {probe.positions} run / {row['distinct_tokens']} distinct / {row['fed_tokens']} fed, "
                  f"{probe.forwards} forwards; ours' stages (s): {stages}; lm-eval's requests {requests_s:.2f} s",
                  flush=True)
    print("\n| task | docs | dtype | ours s (CPU) | limit s (CPU) | ratio (CPU) | GFLOP/s ours | % of matmul peak "
          "(ours / limit) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['docs']} | {r['dtype']} | {r['ours_s']:.2f} ({r['ours_cpu_s']:.2f}) | "
              f"{r['limit_s']:.2f} ({r['limit_cpu_s']:.2f}) | {r['ratio']:.2f}x ({r['ratio_cpu']:.2f}x) | "
              f"{r['gflops_ours']:.1f} | {100 * r['gflops_ours'] / r['peak_gflops']:.0f}% / "
              f"{100 * r['gflops_limit'] / r['peak_gflops']:.0f}% |")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {torch.get_num_threads()} threads")
    if args.out:
        setup = {"model": cfg.model.name, "overrides": args.overrides, "tasks": args.tasks, "limits": args.limits,
                 "threads": torch.get_num_threads(), "rounds": args.rounds, "load_average": os.getloadavg(),
                 "date": time.strftime("%Y-%m-%d %H:%M")}
        args.out.write_text(json.dumps({"setup": setup, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
