"""The machine a latency was measured on: tags, and memory bandwidth for the roofline floor."""

from __future__ import annotations

import functools
import platform
import time

import torch


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment_tags(device: torch.device) -> dict[str, str]:
    tags = {"bench.torch": torch.__version__, "bench.cpu": cpu_model(), "bench.threads": str(torch.get_num_threads()),
            "bench.device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        tags.update({"bench.device_name": props.name, "bench.cuda": str(torch.version.cuda),
                     "bench.driver": _nvidia_driver()})
    else:
        tags["bench.device_name"] = tags["bench.cpu"]
    return tags


def _nvidia_driver() -> str:
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth(device: torch.device) -> float:
    """Bytes/s a full read of a buffer larger than the caches achieves (a sum reads each byte once,
    the access pattern of a weight matrix in a batch-1 decode step): the machine's, measured once per
    process, device and thread count, so a sweep's jobs share one floor as they share the dense
    model's timing, and none pays for measuring it again."""
    return measured_bandwidth(str(device), torch.get_num_threads())


@functools.cache
def measured_bandwidth(device: str, threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """`read_bandwidth` measured: best of `repeats` (`threads`: torch's, which the sum runs on)."""
    where = torch.device(device)
    n = megabytes * 2**20 // 4
    buf = torch.ones(n, dtype=torch.float32, device=where)
    buf.sum()
    synchronize(where)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buf.sum()
        synchronize(where)
        best = min(best, time.perf_counter() - start)
    return n * 4 / best
