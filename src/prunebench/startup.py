"""Library start-up for a job: which warnings and progress bars the libraries may show, and when
Lightning and transformers are imported. Apart from the job's flow because every launcher's job
(local, joblib, SLURM) starts here, and a job that is invalid or already finished never pays for it."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import warnings

import huggingface_hub.utils
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log

from prunebench import collector


def quiet_libraries() -> None:
    """Leaves the libraries' deprecations and progress bars to them. Called when the Hydra job starts
    (every launcher's `run_job` has just configured the job's logging) and again once Lightning is
    loaded (`load_libraries`), which turns its deprecation warnings on when it is imported."""
    # their per-file "Loading weights" / "Map" bars would stand between our per-task bars; transformers
    # and datasets read their switches when first imported, which a job that never runs does not pay
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    else:
        huggingface_hub.utils.disable_progress_bars()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # torch telling Lightning about its own API (LeafSpec), not anything a user set
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(lightning|torch)\.")
    # on a machine with SLURM installed, Lightning suggests srun for every Trainer; jobs here are one process
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")


def load_libraries() -> None:
    """Lightning (torchmetrics, torchvision, scipy and matplotlib with it) and transformers, 2-3 s of
    imports, once a job is known to run. Lightning sets its logger to INFO when it is imported, after
    Hydra configured the job's logging: inside a Hydra job that configuration (with hydra.verbose) is
    then applied again, only by the job that imported them: not by a sweep's later jobs, which Hydra's
    own configuration finds with Lightning loaded (`logging.config` clears every logger's cache for
    each logger it sets)."""
    imported = len(sys.modules)
    with collector.importing():
        skip_gpu_compiler()
        import lightning.pytorch  # noqa: F401
        import transformers  # noqa: F401
    cuda_check_without_nvml()

    if HydraConfig.initialized() and len(sys.modules) > imported:
        hydra_cfg = HydraConfig.get()
        configure_log(hydra_cfg.job_logging, hydra_cfg.verbose)
        quiet_libraries()


def skip_gpu_compiler() -> None:
    """Triton compiles GPU kernels and nothing else, yet torch._dynamo (which Lightning imports)
    imports it whenever it is installed, as torch's wheel has it installed: on a host with no GPU that
    is tens of MB of a job's resident memory and a share of its start-up for nothing. There it is marked
    absent, the way Python spells a module that cannot be imported, so torch takes its own no-Triton
    path (its CPU compiler needs none); a host with a GPU, or a process that imported it already,
    keeps it."""
    import torch

    if not (torch.cuda.is_available() or torch.xpu.is_available()) and sys.modules.setdefault("triton", None) is None:
        # torch's FLOP counter (which Lightning imports) would say so in every job's log
        logging.getLogger("torch.utils.flop_counter").addFilter(no_triton_notice)


def cuda_check_without_nvml() -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported, so that torch counts GPUs through
    NVIDIA's management library (NVML) without initialising CUDA in a process that may fork. On a host
    without that library (no NVIDIA driver) torch then tries to load it again on every
    torch.cuda.is_available(), 40 us, and falls back to the count it gives without the variable; torch's
    FakeTensorMode asks on every operator, some 15% of a FLOPs count (models/flops.py). There the
    variable changes no answer, only the time, and is removed; a host with the library keeps it."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        return
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def no_triton_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("triton not found")
