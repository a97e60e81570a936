"""The console scripts ([project.scripts]) and `python -m prunebench`. Each imports its command's
module under `collector.importing` and closes MLflow's SQL stores when the command ends."""

from __future__ import annotations

from typing import Callable

from prunebench import collector


def run(main: Callable[[], int | None]) -> int | None:
    try:
        return main()
    finally:
        collector.close_stores()


def prunebench() -> None:
    with collector.importing():  # Hydra, validation and MLflow; a job that runs loads Lightning later, likewise
        from prunebench.cli import main
    run(main)


def report() -> int:
    with collector.importing():
        from prunebench.report.cli import main
    return run(main)


def plan() -> int:
    with collector.importing():
        from prunebench.plan import main
    return run(main)


def status() -> int:
    with collector.importing():
        from prunebench.tracking.status import main
    return run(main)


def export() -> int:
    with collector.importing():
        from prunebench.export_cli import main
    return run(main)
