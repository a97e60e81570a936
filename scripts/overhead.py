"""Where a job's time goes before and around its model work: imports, Hydra's compose, the MLflow
store (first open with its migrations, then warm), Lightning's Trainer, and whole jobs end to end
(a one-document tiny-model job on a fresh and on a warm store, the same job already FINISHED and
so skipped, a job refused by validation).

Issue 44's two goals come first: the one-document job (`prunebench ...`, a fresh process, a warm
store) against its floor, the import of the libraries a job must have (`FLOOR`), best of 3 each,
interleaved so that a load that comes and goes weighs on both alike (goal: at most 1.25x the floor
and 1 s beyond it); and what a job after the first adds inside a sweep beyond its own work (goal:
at most 0.5 s), with Hydra's basic launcher (the same process) and with joblib's (reused workers).

    .venv/bin/python scripts/overhead.py [--jobs 4] [--rounds 3] [--only-goals] [--out overhead.json]

The goals' numbers are wall-clock seconds, a sweep's job as the sweep recorded it. Then each phase
runs in a fresh interpreter so that nothing is imported or cached before it is timed, and its number
is given twice: wall-clock seconds, and CPU seconds (user + system, of the process and
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
# the libraries a job must have: what no job can start faster than
FLOOR = "import torch, lightning, torchmetrics, mlflow, transformers, hydra"
PRUNEBENCH = str(Path(sys.executable).parent / "prunebench")
# what a job logs of its own work (pruning.prune, job.execute); the rest of its time is overhead
WORK_METRICS = ("time/score_s", "time/apply_s", "time/eval_s")

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


def command(argv: list[str], env: dict, cwd: str) -> float:
    """Wall seconds of `argv` in a fresh process, start to a successful exit."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)}: exit status {done.returncode}\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def against_floor(env: dict, folder: str, rounds: int) -> dict[str, float]:
    """The one-document job end to end (`prunebench`, a fresh process, a warm store) against the
    floor, best of `rounds` each, interleaved: floor, job, floor, job, ... The floor is given a
    second time with the collector off during the imports, as prunebench imports them
    (collector.py): the stricter measure of what a job adds."""
    store = ["tracking.uri=sqlite:///" + str(Path(folder) / "floor.db"), "tracking.skip_existing=false"]
    argvs = {"floor": [sys.executable, "-c", FLOOR],
             "floor, collector off": [sys.executable, "-c", f"import gc; gc.disable(); {FLOOR}"],
             "job": [PRUNEBENCH, *JOB, *store]}
    command(argvs["job"], env, folder)  # untimed: the store created and migrated, the files in the page cache
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(rounds):
        for name, argv in argvs.items():
            times[name].append(command(argv, env, folder))
    print(f"floor: python -c {FLOOR!r}; job: prunebench {' '.join(JOB)} (warm store)")
    best = {name: min(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        print(f"{name:22s} {' '.join(f'{s:6.2f}' for s in seconds)} s, best {best[name]:.2f} s")
    out = {"floor_s": best["floor"], "floor_collector_off_s": best["floor, collector off"], "job_s": best["job"]}
    for name in ("floor", "floor, collector off"):
        ratio, difference = best["job"] / best[name], best["job"] - best[name]
        print(f"job against the {name}: ratio {ratio:.2f} (goal <= 1.25), difference {difference:+.2f} s "
              f"(goal <= 1 s)", flush=True)
        out[f"ratio to the {name}"], out[f"difference to the {name} s"] = ratio, difference
    return out


def later_jobs(uri: str) -> tuple[int, float, float]:
    """From the sweep's store at `uri`: (how many jobs ran after their process's first, their time
    from the end of that first job to the end of their process's last, their work). A sweep job's
    start and end are on its parent run (`cells.JOB_TAG`, with the process that ran it), its work
    in its own run's metrics (WORK_METRICS); the first job of each process, which imports, and the
    process's start and the sweep's closing, which come once per process or sweep, stay outside."""
    from mlflow.tracking import MlflowClient

    from prunebench.tracking.cells import JOB_TAG, numbered

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string="attributes.status = 'FINISHED'")
    work = {run.data.tags["hydra.overrides"]: sum(run.data.metrics[m] for m in WORK_METRICS)
            for run in runs if WORK_METRICS[0] in run.data.metrics and "mlflow.parentRunId" in run.data.tags}
    parent, = [run for run in runs if run.data.tags.get("prunebench.sweep") == "true"]
    by_process: dict[str, list[dict]] = {}
    for job in numbered(parent.data.tags, JOB_TAG).values():
        by_process.setdefault(job["worker"], []).append(job)
    count, span, later_work = 0, 0.0, 0.0
    for jobs in by_process.values():
        jobs.sort(key=lambda job: job["start"])
        count += len(jobs) - 1
        span += jobs[-1]["end"] - jobs[0]["end"]
        later_work += sum(work[job["overrides"]] for job in jobs[1:])
    return count, span, later_work


def in_sweep(env: dict, folder: str, name: str, launcher: list[str], jobs: int) -> dict[str, float]:
    """What a job after its process's first adds inside a sweep of `jobs` one-document jobs beyond
    its own work (`later_jobs`). The sweep is the usual one, magnitude pruning at `jobs` sparsities
    against a dense baseline already in the store (made first, untimed): each job has a run key of
    its own (jobs of one key take turns under its claim) and does what a pruned job does besides its
    work (the baseline looked up, stability against it, the scores from the score cache)."""
    uri = "sqlite:///" + str(Path(folder) / f"sweep-{name}.db")
    env = {**env, "PRUNEBENCH_CACHE": str(Path(folder) / f"cache-{name}")}
    command([PRUNEBENCH, *JOB, f"tracking.uri={uri}"], env, folder)
    sparsities = ",".join(f"{0.1 * (i + 1):.1f}" for i in range(jobs))
    total = command([PRUNEBENCH, "-m", *JOB, "pruner=magnitude", f"sparsity={sparsities}", *launcher,
                     f"tracking.uri={uri}", "tracking.skip_existing=false"], env, folder)
    count, span, work = later_jobs(uri)
    if not count:
        raise SystemExit(f"in a sweep, {name}: no process ran more than one job of {jobs}")
    overhead = (span - work) / count
    print(f"in a sweep, {name}: {jobs} jobs in {total:.2f} s; {count} ran after their process's first: "
          f"{span / count:.2f} s each, of which their work {work / count:.2f} s: overhead {overhead:.2f} s per job "
          f"(goal <= 0.5 s)", flush=True)
    return {"jobs": jobs, "sweep_s": total, "later_jobs": count, "per_job_s": span / count, "work_s": work / count,
            "overhead_s": overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs in the sweep whose per-job cost is measured")
    parser.add_argument("--rounds", type=int, default=3, help="runs of the floor and of the job, interleaved")
    parser.add_argument("--only-goals", action="store_true", help="the goals only (floor and per-job cost), not the phases")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    if not 2 < args.jobs < 10:
        parser.error("--jobs: 3 to 9 (the sweep's sparsities are 0.1 to 0.9, and joblib's 2 workers each need a later job)")
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "STORE": str(Path(folder) / "phases.db")}
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
        goals = {"against the floor": against_floor(env, folder, args.rounds),
                 "in a sweep, basic launcher (one process)": in_sweep(env, folder, "basic", [], args.jobs),
                 "in a sweep, joblib (2 reused workers)": in_sweep(
                     env, folder, "joblib", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], args.jobs)}
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        if args.only_goals:
            if args.out:
                args.out.write_text(json.dumps({"goals": goals, "load_average": os.getloadavg()}, indent=2))
            return
        for name, (setup, timed) in PHASES.items():
            rows[name] = phase(setup, timed, env)
            show(name, rows[name])
        store = ["tracking.uri=sqlite:///" + str(Path(folder) / "jobs.db"), "tracking.skip_existing=false"]
        rows["tiny job, fresh store"] = job([*JOB, *store], env, folder)
        rows["tiny job, warm store"] = job([*JOB, *store], env, folder)
        rows["tiny job, FINISHED: skipped"] = job([*JOB, store[0]], env, folder)
        rows["job refused by validation"] = job([*JOB, store[0], "pruner=magnitude", "sparsity=1.5"], env, folder,
                                                status=2)
    for name in list(rows)[len(PHASES):]:
        show(name, rows[name])
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.out:
        args.out.write_text(json.dumps({"goals": goals, "wall_cpu_s": rows, "load_average": os.getloadavg()},
                                       indent=2))


def show(name: str, seconds: tuple[float, float]) -> None:
    print(f"{name:40s} wall {seconds[0]:6.2f} s  CPU {seconds[1]:6.2f} s", flush=True)


if __name__ == "__main__":
    main()
