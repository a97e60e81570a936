"""Whole processes side by side: a `prunebench` job against an lm-eval 0.4.13 process on the same
model files and documents, each timed from interpreter start to exit (imports, model load, task
set-up, scoring; ours also its MLflow store and run records).

    .venv/bin/python scripts/whole_process.py model.dtype=bfloat16 task=winogrande data_dir=../shared/data limit=600

The lm-eval process is lm-eval's own: `HFLM(pretrained=<the model folder>)` loads the model, its
TaskManager builds the task from lm-eval's definitions over our documents written in the hub's
schema (evaluation/lm_eval_reference.py), `evaluate()` scores them; it imports nothing of
prunebench but that module's two helpers. Ours runs twice, on a fresh store and again on the warm
one (`tracking.skip_existing=false`, so the job runs again). Wall-clock and CPU seconds (user +
system of the child, all threads) of each, and the ratios; the primary metric of both sides, which
must agree. Overrides are prunebench's (model=gemma3-270m by default: its converted folder is what
both sides load)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from prunebench.evaluation.lm_eval_reference import reference_members
from prunebench.models.gemma_gguf import converted_gemma3_270m
from prunebench.paths import CONF_DIR
from prunebench.validate import validate

from overhead import children_cpu  # bench/, beside this script

LM_EVAL = """
import json, sys
import torch
from lm_eval.models.huggingface import HFLM
from prunebench.evaluation.lm_eval_reference import load_reference, reference_samples
folder, dtype, batch, limit, members = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
lm = HFLM(pretrained=folder, dtype=dtype, batch_size=batch, device="cpu")
samples = reference_samples(lm, load_reference(members), limit)
print(json.dumps({name: {m: sum(d[m] for d in docs) / len(docs) for m in ("acc", "acc_norm") if m in docs[0]}
                  for name, docs in samples.items()}))
"""


def timed(command: list[str], env: dict, cwd: str) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process."""
    start, cpu = time.perf_counter(), children_cpu()
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if out.returncode:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return wall, cpu, out.stdout


def recorded_scores(uri: str, scores_of: dict) -> dict:
    """Each task's acc / acc_norm as our job recorded them in MLflow (its last finished run)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    run = mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'FINISHED'",
                             order_by=["attributes.start_time DESC"]).iloc[0]
    return {name: {m: float(run[f"metrics.{name}/{m}"]) for m in ("acc", "acc_norm") if f"metrics.{name}/{m}" in run}
            for name in scores_of}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (task=..., limit=..., model.dtype=...)")
    parser.add_argument("--lm-eval-batch-size", type=int, default=8, help="HFLM batch_size")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both processes")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    overrides = ["model=gemma3-270m", *args.overrides]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if cfg.model.name != "gemma3-270m" or not cfg.get("limit"):
        raise SystemExit("whole_process.py compares gemma3-270m (the folder both sides load) with a limit=N")
    tasks = validate(cfg)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        members = reference_members(tasks, Path(folder))
        rows["lm-eval"] = timed([sys.executable, "-c", LM_EVAL, str(converted_gemma3_270m()), cfg.model.dtype,
                                 str(args.lm_eval_batch_size), str(cfg.limit), json.dumps(members)], env, folder)
        ours = [sys.executable, "-m", "prunebench", *overrides, "pruner=none", "trainer.enable_progress_bar=false",
                f"tracking.uri=sqlite:///{folder}/mlflow.db"]
        rows["prunebench, fresh store"] = timed(ours, env, folder)
        rows["prunebench, warm store"] = timed([*ours, "tracking.skip_existing=false"], env, folder)
        scores = {"lm-eval": json.loads(rows["lm-eval"][2].strip().splitlines()[-1]),
                  "prunebench": recorded_scores(f"sqlite:///{folder}/mlflow.db", scores_of=tasks)}
    lm_eval_wall, lm_eval_cpu, _ = rows["lm-eval"]
    for name, (wall, cpu, _) in rows.items():
        print(f"{name:26s} wall {wall:7.1f} s  CPU {cpu:7.1f} s  lm-eval / this: wall {lm_eval_wall / wall:.2f}x"
              f"  CPU {lm_eval_cpu / cpu:.2f}x")
    print(f"scores: {scores}; load average {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.write_text(json.dumps({"overrides": overrides, "lm_eval_batch_size": args.lm_eval_batch_size,
                                        "threads": args.threads, "lm_eval_scores": scores,
                                        "wall_cpu_s": {k: v[:2] for k, v in rows.items()}}, indent=2))


if __name__ == "__main__":
    main()
