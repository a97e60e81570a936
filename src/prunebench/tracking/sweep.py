"""One MLflow parent run per Hydra multirun, closed with the right status even when a job fails.

Hydra skips `on_multirun_end` when a job raised, so the parent is also closed at interpreter exit.
Children find the parent through an environment variable, which joblib workers inherit."""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from prunebench.tracking import store

log = logging.getLogger(__name__)
PARENT_ENV = "PRUNEBENCH_SWEEP_RUN_ID"


class SweepRunCallback(Callback):
    def __init__(self) -> None:
        self.run_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.get("plan"):  # the plan, and no parent run: a plan leaves the store as it was
            from hydra import compose

            from prunebench.plan import format_plan, plan

            arguments = list(config.hydra.overrides.task)
            params = OmegaConf.to_container(config.hydra.sweeper.params or {}, resolve=False)
            jobs = plan(arguments, params, lambda o: compose(config.hydra.job.config_name, o))
            print(format_plan(jobs, " ".join(arguments)))
            # the plan is all a plan=true sweep does: stop before Hydra launches (and makes folders for) its jobs
            raise SystemExit(1 if any(j.status == "invalid" for j in jobs) else 0)
        uri = store.tracking_uri(config.tracking.uri)
        self.uri, self.experiment = uri, config.tracking.experiment
        self.sweep_dir = Path(config.hydra.sweep.dir)  # HydraConfig is not set yet here
        exp_id = store.experiment_id(uri, self.experiment)
        overrides = " ".join(config.hydra.overrides.task)
        run = MlflowClient(uri).create_run(exp_id, run_name=f"sweep {self.sweep_dir.name}", tags={
            "prunebench.sweep": "true", "hydra.overrides": overrides, "hydra.sweep_dir": str(self.sweep_dir),
            "git.sha": store.git_sha()})
        self.run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.run_id
        atexit.register(self.close)
        log.info("sweep parent run %s", self.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.close()

    def close(self) -> None:
        """FINISHED when every child finished; FAILED (documented) when any child failed or was
        killed, with counts in tags. Then the sweep's report is logged to the parent."""
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        os.environ.pop(PARENT_ENV, None)
        client = MlflowClient(self.uri)
        children = client.search_runs([client.get_run(run_id).info.experiment_id],
                                      filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
        counts = {s: sum(c.info.status == s for c in children) for s in ("FINISHED", "FAILED", "KILLED", "RUNNING")}
        for status, n in counts.items():
            client.set_tag(run_id, f"prunebench.jobs_{status.lower()}", str(n))
        try:
            from prunebench.report.build import write_report

            if counts["FINISHED"]:
                out = write_report(self.experiment, run_id, self.sweep_dir / "report")
                client.log_artifacts(run_id, str(out), "report")
        except Exception:  # a report failure must not lose the sweep's status
            log.exception("could not build the sweep report")
        failed = counts["FAILED"] + counts["KILLED"] + counts["RUNNING"]
        client.set_terminated(run_id, "FAILED" if failed else "FINISHED")
        log.info("sweep %s: %s", run_id, counts)
