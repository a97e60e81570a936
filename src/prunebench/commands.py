"""The console scripts ([project.scripts]) and `python -m prunebench`: each imports its command's
module under `collector.importing`, which also closes MLflow's SQL stores when the process ends."""

from __future__ import annotations

from prunebench import collector


def prunebench() -> None:
    with collector.importing():  # Hydra, validation and MLflow; a job that runs loads Lightning later, likewise
        from prunebench.cli import main
    main()


def report() -> int:
    with collector.importing():
        from prunebench.report.cli import main
    return main()


def compare() -> int:
    with collector.importing():
        from prunebench.report.compare import main
    return main()


def plan() -> int:
    with collector.importing():
        from prunebench.cli import plan_main
    return plan_main()


def status() -> int:
    with collector.importing():
        from prunebench.tracking.status import main
    return main()


def export() -> int:
    with collector.importing():
        from prunebench.export.cli import main
    return main()
