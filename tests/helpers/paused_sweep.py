"""`prunebench -m OVERRIDES` that holds still in one phase of its first job, so that a test's signal
lands in that phase and nowhere else: the phase's own code is wrapped to write a marker file (its
process id) on reaching it, then sleep until a signal comes. The sleep is in the main thread, where
the phase's code runs, so Ctrl-C and SIGTERM unwind from there as they would from the phase itself.

Run as a script: `python paused_sweep.py PHASE MARKER OVERRIDE...` (tests/tracking/test_interrupt.py)."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from pathlib import Path

NO_SIGNAL_S = 600  # a test that sends none fails by its own guard long before this

# phase: (module, attribute path, whether the pause comes before the wrapped call or after it, and
# which calls pause). After a call the phase's state is built (a model loaded, scores computed, a
# training step or an evaluation batch done); the job's final write of its metrics is paused before.
PHASES = {
    "launch": ("prunebench.job", "run", "before", lambda *a, **k: True),  # Hydra launched the job; no run yet
    "load": ("prunebench.pruning", "get_model", "after", lambda *a, **k: True),
    "score": ("prunebench.pruners.unstructured", "WandaPruner.score", "after", lambda *a, **k: True),
    "recovery": ("prunebench.recovery.train", "RecoveryModule.training_step", "after", lambda *a, **k: True),
    "evaluation": ("prunebench.evaluation.loglikelihood.engine", "LoglikelihoodModule.test_step", "after",
                   lambda *a, **k: True),
    "logging": ("mlflow", "log_metrics", "before", lambda metrics, *a, **k: "avg/score" in metrics),
}


def hold(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    time.sleep(NO_SIGNAL_S)
    raise AssertionError(f"no signal came in {NO_SIGNAL_S} s")


def pause_in(phase: str, marker: Path) -> None:
    """Wraps the phase's function so that its first qualifying call holds (`hold`)."""
    module, path, where, qualifies = PHASES[phase]
    owner = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    real = getattr(owner, name)
    held = []

    @functools.wraps(real)
    def paused(*args, **kwargs):
        first = not held and qualifies(*args[1:] if parents else args, **kwargs)
        if first:
            held.append(True)
            if where == "before":
                hold(marker)
        result = real(*args, **kwargs)
        if first and where == "after":
            hold(marker)
        return result

    setattr(owner, name, paused)


if __name__ == "__main__":
    phase, marker, *overrides = sys.argv[1:]
    pause_in(phase, Path(marker))
    sys.argv = ["prunebench", "-m", *overrides]
    from prunebench.commands import prunebench

    prunebench()
