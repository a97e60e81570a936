"""`hydra/launcher=prunebench_slurm` (and `slurm_gpu`, which builds on it): the plugin's SLURM
launcher, submitting only the cells not done yet (`prunebench.submit`), that under the prunebench
key `detach=true` returns once SLURM has the array instead of waiting for every task. The jobs then
close the sweep themselves (`prunebench.tracking.sweep.close_if_done`). The switch is a prunebench
key, not a launcher option, because the plugin's structured config accepts no key of its own.

The plugin builds its executor and waits inside one method (`launch`) with no hook between, so the
submission is written here against submitit's public API as the plugin uses it: the same folder,
the same parameters under the same names, the same callable (this launcher) per array task."""

import logging
import os
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


class DetachableSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from prunebench.submit import cells_left

        assert self.config is not None and self.hydra_context is not None
        left = cells_left(job_overrides, initial_job_idx,
                          lambda overrides: self.hydra_context.config_loader.load_sweep_config(self.config, overrides))
        log.info("submitting %d of %d cell(s); the others are done or running elsewhere", len(left), len(job_overrides))
        if not left:
            return []
        if not self.config.get("detach"):  # the plugin's own launch, which waits (its jobs numbered from the first left)
            return super().launch(list(left.values()), initial_job_idx)
        self.submit(left)
        return []  # nothing to wait for: each job records its own end on the sweep's parent

    def submit(self, left: dict[int, list[str]]) -> None:
        import submitit
        from mlflow.tracking import MlflowClient

        from prunebench.tracking import cells, store
        from prunebench.tracking.sweep import PARENT_ENV

        params = dict(self.params)
        executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                         slurm_max_num_timeout=params.pop("max_num_timeout"))
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in shared else f"slurm_{k}": v for k, v in params.items()})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        client, parent = MlflowClient(store.tracking_uri(self.config.tracking.uri)), os.environ[PARENT_ENV]
        described = {num: " ".join(filter_overrides(overrides)) for num, overrides in left.items()}
        # before SLURM has them: a cell that ends meanwhile sees the others as not yet submitted
        cells.record_array(client, parent, {n: {"overrides": o, "slurm": None} for n, o in described.items()})
        nums = list(left)
        jobs = executor.map_array(self, [left[n] for n in nums], ["hydra.sweep.dir"] * len(nums), nums,
                                  [f"job_id_for_{n}" for n in nums], [Singleton.get_state()] * len(nums))
        cells.record_array(client, parent, {n: {"overrides": described[n], "slurm": job.job_id}
                                            for n, job in zip(nums, jobs)})
        log.info("SLURM job %s: %d array task(s), not waited for", jobs[0].job_id.split("_")[0], len(jobs))
