"""A sweep's later jobs pay for nothing the first one did once for the process: Hydra configures each
job's logging as it starts, and a job applies that configuration again only when it imported
Lightning, which sets its logger to INFO as it loads (startup.load_libraries). Counted, not timed
(scripts/overhead.py times it); and what the configuration is for still holds: Lightning's INFO lines
stay out of every job's log."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import FIXTURES

# a sweep in a process of its own: `make test-fast` leaves it out
pytestmark = pytest.mark.process

JOBS = 3
SWEEP = ["-m", "model=tiny-llama", "pruner=none", "task=winogrande", f"data_dir={FIXTURES / 'benchmarks'}",
         "limit=1", "trainer.enable_progress_bar=false", "tracking.skip_existing=false",
         "seed=" + ",".join(map(str, range(JOBS)))]
# Hydra's basic launcher runs the jobs in this process; each configure_log call is counted against the
# job it ran in (None: Hydra's own logging, before any job)
CODE = ("import atexit, json, sys\n"
        "import hydra.core.utils\n"
        "from hydra.core.hydra_config import HydraConfig\n"
        "calls, configure = [], hydra.core.utils.configure_log\n"
        "def counted(*args, **kwargs):\n"
        "    calls.append(HydraConfig.get().job.num if HydraConfig.initialized() else None)\n"
        "    return configure(*args, **kwargs)\n"
        "hydra.core.utils.configure_log = counted\n"
        "listing = sys.argv.pop(1)\n"
        "atexit.register(lambda: open(listing, 'w').write(json.dumps(calls)))\n"
        "from prunebench.commands import prunebench\n"
        "prunebench()\n")


def test_a_sweeps_later_jobs_configure_logging_once_and_lightning_stays_quiet(store, tmp_path):
    listing = tmp_path / "calls.json"
    proc = subprocess.run([sys.executable, "-c", CODE, str(listing), *SWEEP], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.count("FINISHED tiny-llama") == JOBS, proc.stderr[-3000:]
    calls = [num for num in json.loads(listing.read_text()) if num is not None]
    # the first job: Hydra's configuration, then again once Lightning is loaded; each later job: Hydra's only
    assert calls == [0, 0, *range(1, JOBS)]
    # Lightning's Trainer says this at INFO; the job's configuration keeps it to WARNING, in every job
    assert "GPU available" not in proc.stdout + proc.stderr
