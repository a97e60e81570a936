"""bbh_zeroshot on dense gemma3-270m, prunebench against lm-eval 0.4.13 on the same local BBH files,
the same model object, the same settings (limit per subtask, greedy, lm-eval's stop strings and 256
new tokens): per-subtask scores, the generations themselves, and the wall time of each harness.

lm-eval runs its own task YAMLs with the dataset pointed at the local files and its default batch
size (1); prunebench runs its Lightning test loop with eval.batch_tokens. The group score is the
size-weighted mean of the subtask scores (lm-eval's `bbh_zeroshot` aggregate).

    .venv/bin/python scripts/bbh_vs_lm_eval.py --data ../shared/data --limit 1 \\
        [--subtasks boolean_expressions,navigate] [--record tests/fixtures/bbh_generations.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_prunebench(loaded, subtasks, data_dir, limit, batch_tokens):
    import lightning as L

    from prunebench.evaluation.registry import evaluation
    from prunebench.tasks.bbh import bbh

    group = bbh("bbh_zeroshot", "zeroshot", subtasks=subtasks, data_dir=data_dir)
    start = time.perf_counter()
    data, module = evaluation(group, loaded, limit, SimpleNamespace(batch_tokens=batch_tokens, add_bos=None))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.test(module, datamodule=data, verbose=False)[0]
    elapsed = time.perf_counter() - start
    scores = {sub: metrics[f"bbh_zeroshot_{sub}/exact_match"] for sub in subtasks}
    generations = {(r["task"].removeprefix("bbh_zeroshot_"), r["doc_id"]): r["response"] for r in module.records}
    return scores, metrics["bbh_zeroshot/exact_match"], generations, elapsed


def run_lm_eval(loaded, subtasks, data_dir, limit, cache):
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks._yaml_loader import load_yaml

    root = Path(lm_eval.__file__).parent / "tasks" / "bbh" / "zeroshot"
    tasks = {}
    for sub in subtasks:
        cfg = load_yaml(root / f"{sub}.yaml")
        cfg.update(dataset_path="json", dataset_name=None,
                   dataset_kwargs={"data_files": {"test": str(Path(data_dir) / "bbh" / f"{sub}.json")},
                                   "field": "examples", "cache_dir": cache})
        tasks[f"bbh_zeroshot_{sub}"] = ConfigurableTask(config=cfg)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=1)
    start = time.perf_counter()
    out = evaluate(lm, tasks, limit=limit, bootstrap_iters=0, log_samples=True)
    elapsed = time.perf_counter() - start
    scores = {sub: out["results"][f"bbh_zeroshot_{sub}"]["exact_match,flexible-extract"] for sub in subtasks}
    sizes = {sub: len({s["doc_id"] for s in out["samples"][f"bbh_zeroshot_{sub}"]}) for sub in subtasks}
    group = sum(scores[s] * sizes[s] for s in subtasks) / sum(sizes.values())
    generations = {(sub, s["doc_id"]): s["resps"][0][0] for sub in subtasks
                   for s in out["samples"][f"bbh_zeroshot_{sub}"]}
    return scores, group, generations, elapsed


def main() -> None:
    from prunebench.models.gemma_gguf import load_gemma3_270m
    from prunebench.tasks.bbh import SUBTASKS

    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--subtasks", default="all")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--record", help="write prunebench's generations here (JSONL)")
    parser.add_argument("--skip-lm-eval", action="store_true")
    args = parser.parse_args()
    subtasks = list(SUBTASKS) if args.subtasks == "all" else args.subtasks.split(",")
    loaded = load_gemma3_270m(name="gemma3-270m")

    ours, our_group, our_gens, our_time = run_prunebench(loaded, subtasks, args.data, args.limit, args.batch_tokens)
    print(json.dumps({"prunebench": {"group": our_group, "seconds": our_time, "subtasks": ours}}), flush=True)
    if args.record:
        with open(args.record, "w", encoding="utf-8") as out:
            for (sub, doc_id), text in sorted(our_gens.items()):
                out.write(json.dumps({"subtask": sub, "doc_id": doc_id, "response": text}) + "\n")
    if args.skip_lm_eval:
        return
    with tempfile.TemporaryDirectory() as cache:
        ref, ref_group, ref_gens, ref_time = run_lm_eval(loaded, subtasks, args.data, args.limit, cache)
    differing = sorted(key for key in ref_gens if ref_gens[key] != our_gens.get(key))
    print(json.dumps({"lm_eval": {"group": ref_group, "seconds": ref_time, "subtasks": ref},
                      "same_scores": ours == ref, "differing_generations": differing,
                      "documents": len(ref_gens)}), flush=True)


if __name__ == "__main__":
    main()
