"""Where a dense job's peak host memory goes: libraries, tokenizer, the model (what the in-process
cache holds and the job's copy), and evaluation's activations, against the weights' own bytes.

    .venv/bin/python scripts/memory_budget.py [model=gemma3-270m task=arc_easy limit=50 ...]

The arguments are Hydra overrides of one job (defaults below: a dense gemma3-270m fp32 job on 50
ARC-Easy documents from ../shared/data). The phases run in one fresh process in a job's order; each
line gives the resident set after the phase (anonymous and file-backed pages apart: a memory-mapped
file's pages count in the resident set while they are mapped) and the high-water mark the phase
reached, both in GB. The last line is `memory/peak_host_gb` as a job logs it (the mark since the job
started, libraries included) over the weights' bytes, the issue's ratio."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ["model=gemma3-270m", "pruner=none", "task=arc_easy", f"data_dir={ROOT.parent / 'shared' / 'data'}",
            "limit=50", "trainer.enable_progress_bar=false"]


def status() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in GB (Linux's /proc; what getrusage lacks)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024 / 1e9
    return fields


def report(phase: str, start: float) -> None:
    now = status()
    print(f"{phase:<34} rss {now['VmRSS']:6.2f}  anon {now['RssAnon']:6.2f}  file {now['RssFile']:6.2f}  "
          f"peak {now['VmHWM']:6.2f}  ({time.perf_counter() - start:5.1f} s)", flush=True)


def weight_bytes(module) -> int:
    """Parameters and buffers, each storage once (Gemma ties its LM head to its embedding)."""
    import torch

    tensors = [*module.parameters(), *module.buffers()]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
                if t.device.type != "meta" and not isinstance(t, torch.nn.UninitializedParameter)}.values())


def main(overrides: list[str]) -> None:
    start = time.perf_counter()
    report("python", start)
    import torch  # noqa: F401  (the libraries a job imports, before any of its work)
    from hydra import compose, initialize_config_dir

    from prunebench.bench import memory
    from prunebench.evaluation.evaluate import evaluate_task
    from prunebench.startup import load_libraries
    from prunebench.models import cache
    from prunebench.paths import CONF_DIR
    from prunebench.validate import validate

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=DEFAULTS + overrides)
    tasks = validate(cfg)
    load_libraries()  # Lightning and transformers, as a job imports them before its model
    report("libraries, config, tasks", start)
    memory.reset_peaks()  # where a job's `memory/peak_host_gb` starts counting
    loaded = cache.get_model(cfg.model)
    report("model loaded (job's, and the cache's)", start)
    held = sum(weight_bytes(kept.model) for kept in cache._PRISTINE.values() if kept.model is not None)
    for name, task in tasks.items():
        evaluate_task(cfg, loaded, name, task)
        report(f"evaluated {name}", start)
    weights = weight_bytes(loaded.model) / 1e9
    peak = memory.peaks()["memory/peak_host_gb"]
    del loaded  # as a sweep's next job starts: the last job's model gone, this one's loaded
    memory.reset_peaks()
    cache.get_model(cfg.model)
    report("next job of a sweep: model loaded", start)
    print(f"weights {weights:.2f} GB; the cache holds {held / 1e9:.2f} GB of weights besides the job's copy")
    print(f"memory/peak_host_gb {peak:.2f} = {peak / weights:.2f}x the weights (the next job's load: "
          f"{memory.peaks()['memory/peak_host_gb'] / weights:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1:])
