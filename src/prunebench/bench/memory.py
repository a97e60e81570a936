"""Peak host and accelerator memory of one job, in GB (`memory/peak_host_gb`,
`memory/peak_accelerator_gb`).

A sweep runs many jobs in one process, so the peaks are reset when a job starts. CUDA resets its
own counters; for the host, Linux resets the resident-set high-water mark (VmHWM) when "5" is
written to /proc/self/clear_refs, which no library wraps. Elsewhere the host figure is the
process's peak so far (getrusage), an upper bound."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

PROC = Path("/proc/self")


def reset_peaks() -> None:
    try:
        (PROC / "clear_refs").write_text("5")
    except OSError:
        pass  # not Linux (or not allowed): peak_host_gb falls back to the process's peak
    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(device)


def host_peak_bytes() -> int:
    try:
        for line in (PROC / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def peaks() -> dict[str, float]:
    """The accelerator figure is the sum over the visible GPUs (one model spread by device_map),
    and absent without CUDA."""
    out = {"memory/peak_host_gb": host_peak_bytes() / 1e9}
    if torch.cuda.is_available():
        out["memory/peak_accelerator_gb"] = sum(
            torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())) / 1e9
    return out
