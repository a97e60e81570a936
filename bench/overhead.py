"""Where a job's time goes before and around its model work: imports, Hydra's compose, the MLflow
store (first open with its migrations, then warm), Lightning's Trainer, and whole jobs end to end
(a one-document tiny-model job on a fresh and on a warm store, the same job already FINISHED and
so skipped, a job refused by validation, and the per-job cost inside a sweep).

    .venv/bin/python bench/overhead.py [--jobs 4] [--out overhead.json]

Each phase runs in a fresh interpreter so that nothing is imported or cached before it is timed.
Every number is given twice: wall-clock seconds, and CPU seconds (user + system, of the process and
its threads or children), which a loaded machine inflates far less than wall-clock time; the load
average is printed beside them."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "benchmarks"
JOB = ["model=tiny-llama", "pruner=none", "task=winogrande", f"data_dir={FIXTURES}", "limit=1",
       "trainer.enable_progress_bar=false"]

# each phase: Python run in a fresh interpreter after `setup` (untimed), printing its seconds
PHASES = {
    "import torch": ("", "import torch"),
    "import lightning": ("import torch", "import lightning"),
    "import transformers": ("import torch", "import transformers"),
    "import mlflow": ("", "import mlflow, mlflow.tracking"),
    "import prunebench.cli": ("", "import prunebench.cli"),
    "import prunebench.job": ("import prunebench.cli", "import prunebench.job"),
    "hydra compose": ("from hydra import compose, initialize_config_dir\nfrom prunebench.paths import CONF_DIR",
                      "with initialize_config_dir(CONF_DIR, version_base='1.3'):\n"
                      "    compose('config', overrides=" + repr(JOB) + ")"),
    "store: first open (create + migrate)": ("from prunebench.tracking import store\nimport os\n"
                                             "uri = 'sqlite:///' + os.environ['STORE']",
                                             "store.experiment_id(uri, 'prunebench')"),
    "store: warm open + run-key lookup": ("from prunebench.tracking import store\nimport os\n"
                                          "uri = 'sqlite:///' + os.environ['STORE']",
                                          "store.finished_run(uri, store.experiment_id(uri, 'prunebench'), 'k')"),
    "Trainer() + empty test": ("import lightning as L, torch\nfrom torch.utils.data import DataLoader\n"
                               "class M(L.LightningModule):\n    def test_step(self, b, i): pass",
                               "L.Trainer(accelerator='cpu', logger=False, enable_progress_bar=False,"
                               " enable_model_summary=False).test(M(), DataLoader([0]), verbose=False)"),
}


def phase(setup: str, timed: str, env: dict) -> tuple[float, float]:
    """(wall, CPU) seconds of `timed` after `setup`, in a fresh interpreter."""
    indented = "\n".join("    " + line for line in timed.splitlines())
    code = (f"{setup}\nimport time\nstart, cpu = time.perf_counter(), time.process_time()\nif True:\n{indented}\n"
            f"print(time.perf_counter() - start, time.process_time() - cpu)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    wall_s, cpu_s = out.stdout.strip().splitlines()[-1].split()
    return float(wall_s), float(cpu_s)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def job(args: list[str], env: dict, cwd: str, status: int = 0) -> tuple[float, float]:
    """(wall, CPU) seconds of `python -m prunebench ARGS`, start to exit (with exit `status`)."""
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run([sys.executable, "-m", "prunebench", *args], env=env, cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != status:
        raise SystemExit(f"prunebench {' '.join(args)}: exit status {done.returncode}, expected {status}")
    return time.perf_counter() - start, children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs in the sweep whose per-job cost is measured")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "STORE": str(Path(folder) / "phases.db")}
        for name, (setup, timed) in PHASES.items():
            rows[name] = phase(setup, timed, env)
            show(name, rows[name])
        store = ["tracking.uri=sqlite:///" + str(Path(folder) / "jobs.db"), "tracking.skip_existing=false"]
        rows["tiny job, fresh store"] = job([*JOB, *store], env, folder)
        rows["tiny job, warm store"] = job([*JOB, *store], env, folder)
        rows["tiny job, FINISHED: skipped"] = job([*JOB, store[0]], env, folder)
        rows["job refused by validation"] = job([*JOB, store[0], "pruner=magnitude", "sparsity=1.5"], env, folder,
                                                status=2)
        seeds = ",".join(str(s) for s in range(args.jobs))
        one = job(["-m", *JOB, *store, "seed=0"], env, folder)
        many = job(["-m", *JOB, *store, f"seed={seeds}"], env, folder)
        rows["sweep of 1 job"], rows[f"sweep of {args.jobs} jobs"] = one, many
        rows["per job inside a sweep"] = tuple((m - o) / (args.jobs - 1) for m, o in zip(many, one))
    for name in list(rows)[len(PHASES):]:
        show(name, rows[name])
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.out:
        args.out.write_text(json.dumps({"wall_cpu_s": rows, "load_average": os.getloadavg()}, indent=2))


def show(name: str, seconds: tuple[float, float]) -> None:
    print(f"{name:40s} wall {seconds[0]:6.2f} s  CPU {seconds[1]:6.2f} s", flush=True)


if __name__ == "__main__":
    main()
