"""The lm-eval bridge (task=lm_eval) against lm-eval 0.4.13's own evaluator with its HF backend, in
one process, on the same model object and the same local files: lm-eval's task objects built once
per side, then each side's evaluation timed (ours: requests -> our engine in the Lightning test loop
-> lm-eval's process_results and aggregation; lm-eval: evaluate() with HFLM).

Per task: seconds of both (wall and CPU), the ratio, the primary metric of both, and how many
documents score the same on it.

    .venv/bin/python scripts/lm_eval_tasks.py model=gemma3-270m model.dtype=bfloat16 data_dir=../shared/data \\
        limit=100 --tasks boolq,rte,mmlu:5 --threads 2

`--tasks`: lm-eval names, `name:k` for k-shot, `name:k:metric` (or `name::metric`) for the metric
compared. Other arguments are prunebench config overrides."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from lightning import Trainer

from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.paths import CONF_DIR
from prunebench.tasks.lm_eval_data import LocalData, local_factory
from prunebench.validate import validate


def timed(function):
    start, cpu = time.perf_counter(), time.process_time()
    out = function()
    return out, time.perf_counter() - start, time.process_time() - cpu


def ours(cfg, loaded, task, accelerator: str):
    def evaluate():
        data, module = evaluation(task, loaded, cfg.get("limit"), cfg.eval)
        logged = Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False).test(module, datamodule=data, verbose=False)[0]
        return logged, module.records
    return timed(evaluate)


def reference(lm, cfg, task, data_dir: str | None):
    """lm-eval's own task objects over the same files (our factory swaps only where the data lies),
    then its evaluate()."""
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=list(task.include_path) or None)
    manager._factory = local_factory(LocalData(data_dir, task.local.data_files, task.num_fewshot), manager.metadata)
    loaded = manager.load([task.lm_eval_name])
    for leaf in loaded["tasks"].values():
        task._configure(leaf)
    return timed(lambda: evaluate(lm, loaded, limit=cfg.get("limit"), bootstrap_iters=task.bootstrap_iters,
                                  log_samples=True, verbosity="WARNING"))


def agreement(task, records: list[dict], out: dict) -> tuple[int, int]:
    """Documents whose primary metric value is the same on both sides (per leaf, by document id)."""
    metric, filter_name = task.top_metrics()[task.primary]
    same = total = 0
    for leaf in task.leaves:
        theirs = {s["doc_id"]: s.get(metric) for s in out["samples"][leaf] if s["filter"] == filter_name}
        for record in records:
            if record["task"] == leaf:
                total += 1
                same += record.get(task.primary) == theirs.get(record["task_doc_id"])
    return same, total


def bridge_tasks(specs: str, overrides: list[str]):
    """(config, validated tasks) of the lm-eval bridge for `--tasks` specs: lm-eval names,
    `name:k` for k-shot, `name:k:metric` for the metric compared."""
    entries = []
    for spec in specs.split(","):
        name, shots, primary = (spec.split(":") + ["", ""])[:3]
        entries.append({"task": name, **({"num_fewshot": int(shots)} if shots else {}),
                        **({"primary": primary} if primary else {})})
    listed = "[" + ",".join("{" + ",".join(f"{k}:{v}" for k, v in e.items()) + "}" for e in entries) + "]"
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["task=lm_eval", f"task.lm_eval={listed}", *overrides])
    return cfg, validate(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (model=..., data_dir=..., limit=...)")
    parser.add_argument("--tasks", default="boolq,rte,mmlu:5", help="lm-eval names, name:k for k-shot, name:k:metric")
    parser.add_argument("--lm-eval-batch-size", default="8", help="HFLM batch_size (int or 'auto')")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads for both sides")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    cfg, tasks = bridge_tasks(args.tasks, args.overrides)
    loaded = get_model(cfg.model)
    accelerator = "gpu" if loaded.device.type == "cuda" else "cpu"
    batch = args.lm_eval_batch_size
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, add_bos_token=cfg.eval.add_bos,
              batch_size=int(batch) if batch.isdigit() else batch, max_length=loaded.max_length)
    rows = {}
    for name, task in tasks.items():
        out, theirs_s, theirs_cpu = reference(lm, cfg, task, cfg.get("data_dir"))
        (logged, records), ours_s, ours_cpu = ours(cfg, loaded, task, accelerator)
        metric, filter_name = task.top_metrics()[task.primary]
        same, total = agreement(task, records, out)
        rows[name] = {"docs": total, "lm_eval_s": theirs_s, "lm_eval_cpu_s": theirs_cpu, "ours_s": ours_s,
                      "ours_cpu_s": ours_cpu, "metric": task.primary,
                      "ours": logged[f"{name}/{task.primary}"],
                      "lm_eval": out["results"][task.lm_eval_name][f"{metric},{filter_name}"], "same": same}
        row = rows[name]
        print(f"{name}: {total} docs  lm-eval {theirs_s:.1f} s (CPU {theirs_cpu:.1f})  ours {ours_s:.1f} s "
              f"(CPU {ours_cpu:.1f})  speedup {theirs_s / ours_s:.2f}x  {task.primary} ours {row['ours']:.4f} "
              f"lm-eval {row['lm_eval']:.4f}  same {same}/{total}", flush=True)
    lm_eval_s, ours_s = sum(r["lm_eval_s"] for r in rows.values()), sum(r["ours_s"] for r in rows.values())
    print(f"all: lm-eval {lm_eval_s:.1f} s  ours {ours_s:.1f} s  speedup {lm_eval_s / ours_s:.2f}x  "
          f"load average {os.getloadavg()[0]:.2f}")
    if args.out:
        setup = {"model": cfg.model.name, "dtype": str(next(loaded.model.parameters()).dtype),
                 "overrides": args.overrides, "tasks": args.tasks, "lm_eval_batch_size": batch,
                 "threads": torch.get_num_threads(), "load_average": os.getloadavg()}
        args.out.write_text(json.dumps({"setup": setup, "tasks": rows}, indent=2))


if __name__ == "__main__":
    main()
