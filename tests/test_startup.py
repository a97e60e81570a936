"""What a job imports. A job that does not run (refused by validation, or already FINISHED) answers
without loading Lightning and what comes with it; no job loads a library its tasks and model do not
use. Read from the modules a real CLI process holds when it exits, so no CPU's speed decides it
(scripts/overhead.py times the same paths). And the collector around those imports: what they add is
frozen once, a sweep's later jobs freeze nothing, and a command still closes its SQLite store."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

from conftest import FIXTURES, TINY_MC
from prunebench import collector, startup
from prunebench.startup import skip_gpu_compiler

JOB = ["model=tiny-llama", "pruner=none", "task=winogrande", f"data_dir={FIXTURES / 'benchmarks'}", "limit=1",
       "trainer.enable_progress_bar=false"]
# no tiny-llama winogrande job uses these: lm-eval's own tasks, image models, HF datasets, MLflow's
# server; nor, with no GPU in sight (CUDA_VISIBLE_DEVICES="" below, so on any host), Triton
UNUSED = {"lm_eval", "timm", "datasets", "sklearn", "mlflow.server", "triton"}
# what only a job that runs needs: Lightning imports torchmetrics, which imports torchvision,
# matplotlib and transformers
RUNNING = {"lightning", "torchmetrics", "torchvision", "matplotlib", "transformers"}
CODE = ("import atexit, sys\n"
        "listing = sys.argv.pop(1)\n"
        # a module marked absent (sys.modules[name] = None) was never imported
        "names = lambda: (name for name, module in sys.modules.items() if module is not None)\n"
        "atexit.register(lambda: open(listing, 'w').write('\\n'.join(names())))\n"
        "from prunebench.commands import prunebench\n"
        "prunebench()\n")


def cli(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -m prunebench ARGS`, and the top-level packages and modules it had imported when it exited."""
    listing = tmp_path / "modules.txt"
    proc = subprocess.run([sys.executable, "-c", CODE, str(listing), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
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
    assert "triton" not in proc.stdout + proc.stderr  # nor does its log mention it
    # its libraries frozen, it still closed its store: an open connection leaves SQLite's -wal and -shm
    assert sorted(p.name for p in tmp_path.glob("mlflow.db*")) == ["mlflow.db", "mlflow.db.lock"]
    proc, modules = cli(tmp_path, *JOB)
    assert proc.returncode == 0 and "skipping: run" in proc.stdout, proc.stderr[-3000:]
    assert loaded(modules, RUNNING | UNUSED) == set()
    assert "mlflow" in modules  # it did open the store to find the FINISHED run


@pytest.mark.parametrize("gpu", [False, True])
def test_triton_is_marked_absent_only_where_no_gpu_could_run_its_kernels(monkeypatch, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    skip_gpu_compiler()
    assert ("triton" in sys.modules) is not gpu and sys.modules.get("triton") is None
    imported = object()  # a process that imported it already keeps it, GPU or not
    monkeypatch.setitem(sys.modules, "triton", imported)
    skip_gpu_compiler()
    assert sys.modules["triton"] is imported


@pytest.mark.parametrize("nvml", [False, True])
def test_the_nvml_based_cuda_check_is_dropped_only_where_nvml_cannot_load(monkeypatch, nvml):
    """Where NVML cannot load, torch's NVML-based check falls back to the count it gives without it:
    the variable (Lightning's) goes, and no answer changes; where NVML loads, it stays."""
    def cdll(name):
        if not nvml:
            raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    available = torch.cuda.is_available()
    monkeypatch.setattr(startup.ctypes, "CDLL", cdll)
    startup.cuda_check_without_nvml()
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == ("1" if nvml else None)
    assert torch.cuda.is_available() == available


def test_a_job_drops_the_check_only_where_this_host_cannot_load_nvml(monkeypatch):
    import ctypes

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    startup.load_libraries()
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
    else:
        assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


class Cycle:
    pass


def test_imports_are_frozen_once_and_a_batch_that_adds_nothing_freezes_nothing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "freshly_made_module.py").write_text("TABLE = [[i] for i in range(1000)]\n")
    frozen = gc.get_freeze_count()
    try:
        with collector.importing():
            assert not gc.isenabled()
            import freshly_made_module  # noqa: F401
        assert gc.isenabled() and gc.get_freeze_count() > frozen + 1000
        frozen = gc.get_freeze_count()
        garbage = Cycle()  # what a sweep's previous job leaves behind: it must stay collectable
        garbage.self, alive = garbage, weakref.ref(garbage)
        del garbage
        with collector.importing():
            import freshly_made_module  # noqa: F401,F811
        # at most as many: a frozen object another thread frees leaves the permanent generation (CI saw 3)
        assert gc.isenabled() and gc.get_freeze_count() <= frozen
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()  # the test process's objects back under the collector
        sys.modules.pop("freshly_made_module", None)



def test_a_job_run_outside_the_console_scripts_still_closes_its_store(store, tmp_path):
    """As a SLURM or joblib job runs one: `job.run` in a process of its own, which freezes what
    `load_libraries` imports; the store is closed at its exit all the same."""
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\nfrom conftest import compose_cfg\n"
            "from prunebench.job import run\nrun(compose_cfg(sys.argv[2:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(FIXTURES.parent), *JOB], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("mlflow.db*")) == ["mlflow.db", "mlflow.db.lock"]
