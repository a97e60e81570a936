"""The launcher a plan's sweeper hands its jobs to (`prunebench.plan.sweep_plan`): it runs none and
returns each job's overrides, so a plan lists the jobs exactly as the sweeper of `prunebench -m`
expands them (a preset's axes, `glob()`, `range()`, `choice()`, interpolations), by Hydra's own
parser with its config loader. A Hydra plugin must live under `hydra_plugins` to be instantiated."""

from typing import Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher


class PlanLauncher(Launcher):
    def __init__(self, **_: object) -> None:
        self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        return [JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED) for overrides in job_overrides]
