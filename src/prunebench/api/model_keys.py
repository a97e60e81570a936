"""Model-config keys that describe a model for planning (`prunebench-plan`'s cost classes) and are
no loader's argument: the loader drops them, and run keys ignore them."""

from pathlib import Path

PLANNING_KEYS = ("params_b",)


def machine_dtype(device: str) -> str:
    """`model.dtype=auto`: bf16 where the hardware computes it natively (a CUDA GPU that supports
    it; a CPU with AVX512-BF16 or AMX, where bf16 matmuls run natively; README's times),
    else fp16 on an older GPU and fp32 on other CPUs. torch's CPU feature probes are the only
    portable ones it has, private as they are."""
    import torch

    kind = str(device).split(":")[0]
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    if kind == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return "bfloat16"
    return "float32"


def run_dtype(model_cfg) -> str:
    """The dtype a job's model runs in: `model.dtype`, `auto` resolved for `model.device`. Run keys
    and the `prunebench.dtype` tag hold this, so the same config on different machines does not
    share numbers it did not compute alike."""
    dtype = model_cfg.get("dtype", "float32")
    return machine_dtype(model_cfg.get("device") or "cpu") if dtype == "auto" else dtype


def display_name(name: str) -> str:
    """A model's name as run names show it: a hub id or a preset's name as it is; a local folder by
    its own name (`hf_causal` names its model by `model.path`, and a 60-character cache path buried
    the pruner and ratio in the UI's run list); a hub cache's snapshot folder
    (`.../models--org--name/snapshots/<sha>`) by the hub id it holds."""
    path = Path(name).expanduser()
    if not (path.is_absolute() or name.startswith(".")):
        return name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name or name
