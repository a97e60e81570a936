"""What a job imports. A job that does not run (refused by validation, or already FINISHED) answers
without loading Lightning and what comes with it; no job loads a library its tasks and model do not
use. Read from the modules a real CLI process holds when it exits, so no CPU's speed decides it
(bench/overhead.py times the same paths)."""

from __future__ import annotations

import subprocess
import sys

from conftest import FIXTURES, TINY_MC

JOB = ["model=tiny-llama", "pruner=none", "task=winogrande", f"data_dir={FIXTURES / 'benchmarks'}", "limit=1",
       "trainer.enable_progress_bar=false"]
# no tiny-llama winogrande job uses these: lm-eval's own tasks, image models, HF datasets, MLflow's server
UNUSED = {"lm_eval", "timm", "datasets", "sklearn", "mlflow.server"}
# what only a job that runs needs: Lightning imports torchmetrics, which imports torchvision,
# matplotlib and transformers
RUNNING = {"lightning", "torchmetrics", "torchvision", "matplotlib", "transformers"}
CODE = ("import atexit, sys\n"
        "listing = sys.argv.pop(1)\n"
        "atexit.register(lambda: open(listing, 'w').write('\\n'.join(sys.modules)))\n"
        "from prunebench.cli import main\n"
        "main()\n")


def cli(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -m prunebench ARGS`, and the top-level packages and modules it had imported when it exited."""
    listing = tmp_path / "modules.txt"
    proc = subprocess.run([sys.executable, "-c", CODE, str(listing), *args], capture_output=True, text=True,
                          timeout=300)
    modules = set(listing.read_text().split("\n"))
    return proc, modules


def loaded(modules: set[str], names: set[str]) -> set[str]:
    return {name for name in names if any(m == name or m.startswith(name + ".") for m in modules)}


def test_a_refused_job_loads_neither_lightning_nor_what_its_job_would_use(store, tmp_path):
    proc, modules = cli(tmp_path, *TINY_MC, "sparsity=1.5")
    assert proc.returncode == 2 and "sparsity=1.5" in proc.stderr, proc.stderr[-3000:]
    assert loaded(modules, RUNNING | UNUSED) == set()
    assert loaded(modules, {"hydra", "omegaconf"}) == {"hydra", "omegaconf"}  # the listing is the process's own


def test_a_job_loads_only_what_it_uses_and_a_finished_one_skips_before_lightning(store, tmp_path):
    proc, modules = cli(tmp_path, *JOB)
    assert proc.returncode == 0 and "FINISHED tiny-llama" in proc.stdout, proc.stderr[-3000:]
    assert loaded(modules, UNUSED) == set()
    assert loaded(modules, RUNNING) == RUNNING
    proc, modules = cli(tmp_path, *JOB)
    assert proc.returncode == 0 and "skipping: run" in proc.stdout, proc.stderr[-3000:]
    assert loaded(modules, RUNNING | UNUSED) == set()
    assert "mlflow" in modules  # it did open the store to find the FINISHED run
