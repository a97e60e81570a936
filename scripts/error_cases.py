"""The table of docs/errors.md: each bad-input case of tests/test_bad_input.py (and a few config
cases) through the CLI, as a user meets it: its message, the exit status, the seconds from the
command to the error (interpreter start included) on the wall clock and in CPU time (the wall clock
of a loaded machine says more about its other users), and whether any run was left RUNNING.

    PYTHONPATH=src python scripts/error_cases.py [CASE ...] > /tmp/errors_table.md
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))
from test_bad_input import CASES, case_overrides  # noqa: E402  (the cases are the test's)

from conftest import TINY_MC  # noqa: E402

CONFIG_CASES = {"unknown experiment": ["experiment=nope"], "unknown task": ["task=nope"],
                "sparsity outside [0, 1)": ["sparsity=1.5"],
                # HF_HUB_OFFLINE=1 below: the hub id is looked up in the cache alone
                "hub id without the hub": ["model=hf_causal", "model.path=prunebench-tests/no-such-model"]}


def message(stderr: str) -> str:
    # Hydra's own refusal (an unknown option) is the line it starts "In ...: Could not find ..."
    lines = [line for line in stderr.splitlines() if "Could not find" in line] or \
        [line for line in stderr.splitlines() if "Error" in line or "invalid config" in line]
    text = lines[-1] if lines else stderr.strip().splitlines()[-1]
    return text.split("ConfigError: ")[-1].split("invalid config: ")[-1].replace("|", "\\|")[:300]


def main() -> None:
    print("| case | message | exit | wall s | CPU s | runs RUNNING |")
    print("|---|---|---|---|---|---|")
    for name in [*CASES, *CONFIG_CASES]:
        if sys.argv[1:] and name not in sys.argv[1:]:  # the cases named on the command line, else all
            continue
        with tempfile.TemporaryDirectory() as tmp:
            overrides = case_overrides(name, Path(tmp)) if name in CASES else [*TINY_MC[:1], *CONFIG_CASES[name]]
            uri = f"sqlite:///{tmp}/mlflow.db"
            start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, "-m", "prunebench", *overrides, "trainer.enable_progress_bar=false"],
                                  capture_output=True, text=True, cwd=tmp,
                                  # no case may reach the hub: a hub id is then refused from the cache alone
                                  env={**os.environ, "MLFLOW_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1"})
            seconds = time.perf_counter() - start
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
            running = 0
            if Path(f"{tmp}/mlflow.db").exists():
                mlflow.set_tracking_uri(uri)
                if mlflow.get_experiment_by_name("prunebench"):
                    runs = mlflow.search_runs(experiment_names=["prunebench"])
                    running = int((runs.status == "RUNNING").sum()) if not runs.empty else 0
            print(f"| {name} | {message(proc.stderr)} | {proc.returncode} | {seconds:.1f} | {cpu_s:.1f} | {running} |", flush=True)


if __name__ == "__main__":
    main()
