"""The reference harness, lm-eval 0.4.13, run on the documents prunebench reads.

Conformance tests and the throughput benchmark need lm-eval's own task definitions, not copies of
them: each of our tasks' documents is written as JSON lines in the hub's schema and handed to
lm-eval's TaskManager as that task's dataset (`dataset_path: json`), so lm-eval's YAML and Python
preprocessing build the requests."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# our task name -> the folder of lm-eval's task definitions that holds it (the task names agree)
LM_EVAL_FOLDERS = {"arc_easy": "arc", "arc_challenge": "arc", "hellaswag": "hellaswag", "piqa": "piqa",
                   "winogrande": "winogrande", "openbookqa": "openbookqa", "commonsense_qa": "commonsense_qa"}


def reference_tasks(tasks: dict, folder: Path) -> dict:
    """{name: lm-eval Task} over the same source documents as our `tasks` (before process_docs)."""
    return load_reference(reference_members(tasks, folder))


def reference_members(tasks: dict, folder: Path) -> list[dict]:
    """Each task's documents written to `folder` as JSON lines in the hub's schema -> the lm-eval
    group members that read them (JSON: a separate lm-eval process can load them)."""
    unknown = sorted(set(tasks) - set(LM_EVAL_FOLDERS))
    if unknown:
        raise ValueError(f"no lm-eval task definition known for {unknown}; known: {sorted(LM_EVAL_FOLDERS)}")
    members = []
    for name, task in tasks.items():
        path = Path(folder) / f"{name}.jsonl"
        path.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in task.source.load()),
                        encoding="utf-8")
        splits = {split: str(path) for split in ("train", "validation", "test")}
        members.append({"task": name, "dataset_path": "json", "dataset_name": None,
                        "dataset_kwargs": {"data_files": splits}})
    return members


def load_reference(members: list[dict]) -> dict:
    """{name: lm-eval Task} for `reference_members`' members, through lm-eval's own task definitions."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    # indexing only these folders takes a second; lm-eval's whole task tree takes many
    manager = TaskManager(include_defaults=False,
                          include_path=sorted({str(root / LM_EVAL_FOLDERS[m["task"]]) for m in members}))
    # overrides reach a task only as a member of a group
    return manager.load({"group": "prunebench_reference", "task": members})["tasks"]


def reference_requests(task, limit: int | None = None) -> list[list[tuple[str, str]]]:
    """Per document, lm-eval's (context, continuation) loglikelihood requests in choice order."""
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    by_doc = defaultdict(list)
    for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        by_doc[inst.doc_id].append(tuple(inst.arguments))
    return [by_doc[d] for d in sorted(by_doc)]


def reference_samples(lm, tasks: dict, limit: int | None = None) -> dict[str, list[dict]]:
    """lm-eval's evaluate() on `tasks` with model `lm`: per task, per document (in order) its
    log-likelihoods and metric values."""
    from lm_eval.evaluator import evaluate

    task_dict = {"tasks": tasks, "groups": {}, "group_map": {}}
    out = evaluate(lm, task_dict, limit=limit, bootstrap_iters=0, log_samples=True, verbosity="WARNING")
    samples = {}
    for name, docs in out["samples"].items():
        samples[name] = [{"doc_id": s["doc_id"], "loglikelihoods": [float(r[0]) for r in s["filtered_resps"]],
                          **{m: float(s[m]) for m in s["metrics"]}}
                         for s in sorted(docs, key=lambda s: s["doc_id"])]
    return samples
