"""prunebench's multiple-choice scorer against lm-eval 0.4.13's HF backend, in one process: the same
model object, the same documents, each side's own task pipeline (ours: task -> DataModule ->
Lightning test loop; lm-eval: its TaskManager's task definitions -> evaluate() with HFLM).

Per task and overall: seconds of both, their ratio, the primary metric of both, and how many
documents get the same prediction, for each `--numerics` setting of ours (eval.numerics) against
lm-eval at `--lm-eval-batch-size`; and the same agreement of lm-eval at `--noise-batch-size` with
itself at the reference batch size, the noise floor at the model's dtype. A disagreement whose two
best scores are within --tie of each other is counted as a near-tie.

    .venv/bin/python scripts/mc_throughput.py model=gemma3-270m model.dtype=bfloat16 task=winogrande \
        data_dir=../shared/data limit=600 eval.lm_eval_batch_size=8 --numerics fast,lm_eval

Arguments other than the --options are prunebench config overrides: any `model.dtype`,
`model.device=cuda` for a GPU, `limit=null` for whole splits."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from lightning import Trainer
from omegaconf import OmegaConf

from prunebench.api.metrics import first_argmax
from prunebench.paths import CONF_DIR
from prunebench.evaluation.batching import budget
from prunebench.evaluation.lm_eval_reference import reference_samples, reference_tasks
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.validate import validate


def predictions(lls: list[float], choice_lengths: list[int], metric: str) -> int:
    """lm-eval's rule: acc_norm divides by the choice's length in characters."""
    return first_argmax([ll / n if metric == "acc_norm" and n else ll for ll, n in zip(lls, choice_lengths)])


def run_ours(cfg, loaded, task, numerics: str, accelerator: str) -> tuple[list[dict], float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    data, module = evaluation(task, loaded, cfg.get("limit"), OmegaConf.merge(cfg.eval, {"numerics": numerics}))
    Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False).test(module, datamodule=data, verbose=False)
    return sorted(module.records, key=lambda r: r["doc_id"]), time.perf_counter() - start, time.process_time() - cpu


def run_lm_eval(lm, reference_task, name: str, limit) -> tuple[list[dict], float, float]:
    """(samples, wall s, CPU s): CPU seconds of all threads, which other jobs on a loaded machine
    inflate far less than wall-clock seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    samples = reference_samples(lm, {name: reference_task}, limit)[name]
    return samples, time.perf_counter() - start, time.process_time() - cpu


def compare(task, ours: list[dict], theirs: list[dict], tie: float) -> dict:
    instances = task.instances(len(ours))
    metric = task.primary
    agree, ties, max_diff = 0, [], 0.0
    for inst, mine, ref in zip(instances, ours, theirs):
        max_diff = max(max_diff, *(abs(a - b) for a, b in zip(mine["loglikelihoods"], ref["loglikelihoods"])))
        mine_pred = predictions(mine["loglikelihoods"], inst.choice_lengths, metric)
        ref_pred = predictions(ref["loglikelihoods"], inst.choice_lengths, metric)
        if mine_pred == ref_pred:
            agree += 1
            continue
        norm = [ll / n if metric == "acc_norm" and n else ll for ll, n in zip(ref["loglikelihoods"], inst.choice_lengths)]
        gap = abs(norm[mine_pred] - norm[ref_pred])
        ties.append({"doc_id": inst.doc_id, "ours": mine_pred, "lm_eval": ref_pred, "gap": gap, "near_tie": gap < tie})
    return {"metric": metric, "ours": sum(r[metric] for r in ours) / len(ours),
            "lm_eval": sum(r[metric] for r in theirs) / len(theirs), "agree": agree, "disagreements": ties,
            "max_abs_loglik_diff": max_diff}


def main() -> None:
    wall = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (model=..., task=..., limit=...)")
    parser.add_argument("--numerics", default="lm_eval,fast", help="eval.numerics settings of ours to run, comma-separated")
    parser.add_argument("--lm-eval-batch-size", default="8", help="HFLM batch_size (int or 'auto'): the reference")
    parser.add_argument("--noise-batch-size", default="1",
                        help="a second HFLM batch_size whose agreement with the reference is lm-eval's own noise "
                             "floor ('' skips it)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads for both sides")
    parser.add_argument("--tie", type=float, default=1e-4, help="score gap under which a disagreement is a near-tie")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["task=commonsense", *args.overrides])
    tasks = validate(cfg)
    loaded = get_model(cfg.model)
    accelerator = "gpu" if loaded.device.type == "cuda" else "cpu"
    settings = args.numerics.split(",")

    def hflm(batch: str):
        return HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, add_bos_token=cfg.eval.add_bos,
                    batch_size=int(batch) if batch.isdigit() else batch, max_length=loaded.max_length)

    lms = {"reference": hflm(args.lm_eval_batch_size), **({"noise": hflm(args.noise_batch_size)}
                                                            if args.noise_batch_size else {})}
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        reference = reference_tasks(tasks, Path(folder))
        for name, task in tasks.items():
            theirs, theirs_s, theirs_cpu = run_lm_eval(lms["reference"], reference[name], name, cfg.get("limit"))
            row = {"docs": len(theirs), "lm_eval_s": theirs_s, "lm_eval_cpu_s": theirs_cpu, "ours": {}}
            if "noise" in lms:
                other, other_s, other_cpu = run_lm_eval(lms["noise"], reference[name], name, cfg.get("limit"))
                row["noise"] = {"lm_eval_s": other_s, "lm_eval_cpu_s": other_cpu, **compare(task, other, theirs, args.tie)}
            for numerics in settings:
                ours, ours_s, ours_cpu = run_ours(cfg, loaded, task, numerics, accelerator)
                row["ours"][numerics] = {"ours_s": ours_s, "ours_cpu_s": ours_cpu, **compare(task, ours, theirs, args.tie)}
            rows[name] = row
            print_row(name, row)
    print("\nall:")
    for numerics in settings:
        docs = sum(r["docs"] for r in rows.values())
        ours_s = sum(r["ours"][numerics]["ours_s"] for r in rows.values())
        lm_eval_s = sum(r["lm_eval_s"] for r in rows.values())
        agree = sum(r["ours"][numerics]["agree"] for r in rows.values())
        print(f"  numerics={numerics}: {docs} docs  ours {ours_s:.1f} s  lm-eval {lm_eval_s:.1f} s  "
              f"speedup {lm_eval_s / ours_s:.2f}x  same predictions {agree}/{docs} ({100 * agree / docs:.2f}%)")
    total_s = time.perf_counter() - wall
    print(f"  this process: {total_s:.1f} s; load average {os.getloadavg()[0]:.2f}")
    if args.out:
        setup = {"model": cfg.model.name, "dtype": str(next(loaded.model.parameters()).dtype),
                 "device": str(loaded.device), "overrides": args.overrides,
                 "lm_eval_batch_size": args.lm_eval_batch_size, "noise_batch_size": args.noise_batch_size,
                 "threads": torch.get_num_threads(), "batch_tokens": budget(cfg.eval, loaded.device, scoring=True),
                 "process_s": total_s, "load_average": os.getloadavg()}
        args.out.write_text(json.dumps({"setup": setup, "tasks": rows}, indent=2))


def print_row(name: str, row: dict) -> None:
    n = row["docs"]
    line = f"{name}: {n} docs  lm-eval {row['lm_eval_s']:.1f} s (CPU {row['lm_eval_cpu_s']:.1f} s)"
    if "noise" in row:
        noise = row["noise"]
        line += f"  (other batch size {noise['lm_eval_s']:.1f} s, same predictions {noise['agree']}/{n})"
    print(line, flush=True)
    for numerics, mine in row["ours"].items():
        print(f"  numerics={numerics}: {mine['ours_s']:.1f} s (CPU {mine['ours_cpu_s']:.1f} s)  speedup "
              f"{row['lm_eval_s'] / mine['ours_s']:.2f}x (CPU {row['lm_eval_cpu_s'] / mine['ours_cpu_s']:.2f}x)  "
              f"{mine['metric']} ours {mine['ours']:.4f} lm-eval {mine['lm_eval']:.4f}  same predictions "
              f"{mine['agree']}/{n}  max |dll| {mine['max_abs_loglik_diff']:.1e}", flush=True)


if __name__ == "__main__":
    main()
