"""prunebench's multiple-choice scorer against lm-eval 0.4.13's HF backend, in one process: the same
model object, the same documents, each side's own task pipeline (ours: task -> DataModule ->
Lightning test loop; lm-eval: its TaskManager's task definitions -> evaluate() with HFLM).

Prints, per task and overall, examples/s of both, their ratio, and how often the predictions of the
task's primary metric agree. A disagreement whose two best lm-eval scores are within --tie of each
other is counted as a near-tie: fp32 summation order alone can flip it.

    .venv/bin/python bench/mc_throughput.py model=gemma3-270m task=commonsense data_dir=../shared/data \\
        task.tasks.hellaswag.source.path=../shared/data/hellaswag/hellaswag_val_full.txt.bz2 limit=100

Arguments other than the --options are prunebench config overrides. Needs the `ref` extra."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from lightning import Trainer

from prunebench.api.metrics import first_argmax
from prunebench.paths import CONF_DIR
from prunebench.evaluation.lm_eval_reference import reference_samples, reference_tasks
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.validate import validate


def predictions(lls: list[float], choice_lengths: list[int], metric: str) -> int:
    """lm-eval's rule: acc_norm divides by the choice's length in characters."""
    return first_argmax([ll / n if metric == "acc_norm" and n else ll for ll, n in zip(lls, choice_lengths)])


def run_ours(cfg, loaded, task) -> tuple[list[dict], float]:
    start = time.perf_counter()
    data, module = evaluation(task, loaded, cfg.get("limit"), cfg.eval)
    Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        module, datamodule=data, verbose=False)
    return sorted(module.records, key=lambda r: r["doc_id"]), time.perf_counter() - start


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (model=..., task=..., limit=...)")
    parser.add_argument("--lm-eval-batch-size", default="8", help="HFLM batch_size (int or 'auto')")
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
    batch = args.lm_eval_batch_size
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=int(batch) if batch.isdigit() else batch,
              add_bos_token=cfg.eval.add_bos, max_length=loaded.max_length)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        reference = reference_tasks(tasks, Path(folder))
        for name, task in tasks.items():
            ours, ours_s = run_ours(cfg, loaded, task)
            start = time.perf_counter()
            theirs = reference_samples(lm, {name: reference[name]}, cfg.get("limit"))[name]
            theirs_s = time.perf_counter() - start
            rows[name] = {"docs": len(ours), "ours_s": ours_s, "lm_eval_s": theirs_s,
                          **compare(task, ours, theirs, args.tie)}
            print_row(name, rows[name])
    docs = sum(r["docs"] for r in rows.values())
    total = {"docs": docs, "ours_s": sum(r["ours_s"] for r in rows.values()),
             "lm_eval_s": sum(r["lm_eval_s"] for r in rows.values()), "agree": sum(r["agree"] for r in rows.values()),
             "near_ties": sum(d["near_tie"] for r in rows.values() for d in r["disagreements"])}
    print(f"\nall: {docs} docs  ours {docs / total['ours_s']:.2f} docs/s  lm-eval {docs / total['lm_eval_s']:.2f} "
          f"docs/s  speedup {total['lm_eval_s'] / total['ours_s']:.2f}x  identical predictions "
          f"{100 * total['agree'] / docs:.2f}% ({docs - total['agree']} differ, {total['near_ties']} near-ties)")
    if args.out:
        setup = {"model": cfg.model.name, "overrides": args.overrides, "lm_eval_batch_size": batch,
                 "threads": torch.get_num_threads(), "batch_tokens": cfg.eval.batch_tokens}
        args.out.write_text(json.dumps({"setup": setup, "tasks": rows, "all": total}, indent=2))


def print_row(name: str, row: dict) -> None:
    n = row["docs"]
    print(f"{name}: {n} docs  ours {n / row['ours_s']:.2f} docs/s  lm-eval {n / row['lm_eval_s']:.2f} docs/s  "
          f"speedup {row['lm_eval_s'] / row['ours_s']:.2f}x  {row['metric']} ours {row['ours']:.4f} lm-eval "
          f"{row['lm_eval']:.4f}  same predictions {row['agree']}/{n}  max |dll| {row['max_abs_loglik_diff']:.1e}",
          flush=True)


if __name__ == "__main__":
    main()
