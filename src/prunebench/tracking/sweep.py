"""One MLflow parent run per Hydra multirun, closed with the right status even when a job fails.

Hydra skips `on_multirun_end` when a job raised, so the parent is also closed at interpreter exit.
Children find the parent through an environment variable, which joblib workers inherit. The
sweep's report is built by the function the config names (`report`), so tracking imports nothing
of the report, which reads tracking's runs."""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from hydra.utils import get_method
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from prunebench.api.errors import ConfigError
from prunebench.tracking import claim, server, store

log = logging.getLogger(__name__)
PARENT_ENV = "PRUNEBENCH_SWEEP_RUN_ID"
# a tag on the parent per grid cell answered by a run made earlier (a skipped job, a dense baseline
# already in the store): with the parent's children, the sweep's report covers its whole grid
CELL_TAG = "prunebench.cell."


def record_cell(uri: str, parent_run_id: str, run) -> None:
    """Each job writes its own tag, so parallel jobs never overwrite each other's."""
    MlflowClient(uri).set_tag(parent_run_id, CELL_TAG + run.data.tags[store.KEY_TAG], run.info.run_id)


def cell_run_ids(parent) -> list[str]:
    return [value for key, value in parent.data.tags.items() if key.startswith(CELL_TAG)]


class SweepRunCallback(Callback):
    """`report`: import path of a function (experiment, sweep run id, folder) -> the folder it wrote;
    its files are logged to the parent run under report/ (None: no report). `planner`: import path
    of a function (the sweep's config) -> exit status, which prints the grid under plan=true. Both
    are named in the config so that tracking imports nothing above it."""

    def __init__(self, report: str | None = None, planner: str | None = None) -> None:
        self.report, self.planner = report, planner
        self.run_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.get("plan"):  # the plan, and no parent run: a plan leaves the store as it was
            # the plan is all a plan=true sweep does: stop before Hydra launches (and makes folders for) its jobs
            raise SystemExit(get_method(self.planner)(config))
        server.check(config.tracking)  # before the sweep's first request: a job would refuse the same
        server.export_http_settings(config.tracking)
        uri = store.tracking_uri(config.tracking.uri)
        try:
            store.check_uri(uri)
        except ConfigError as err:  # Hydra would only warn of a callback's exception and run every job into it
            raise SystemExit(f"prunebench: invalid config: {err}") from None
        self.uri, self.experiment = uri, config.tracking.experiment
        self.sweep_dir = Path(config.hydra.sweep.dir)  # HydraConfig is not set yet here
        self.stale_s = config.tracking.claim.stale_s
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
        # a job killed outright (SIGKILL, scancel) could not end its own run
        ended = {c.info.run_id for c in children if c.info.status == "RUNNING"
                 and claim.end_if_gone(client, c, claim.worker_id(), self.stale_s)}
        statuses = ["KILLED" if c.info.run_id in ended else c.info.status for c in children]
        counts = {s: statuses.count(s) for s in ("FINISHED", "FAILED", "KILLED", "RUNNING")}
        for status, n in counts.items():
            client.set_tag(run_id, f"prunebench.jobs_{status.lower()}", str(n))
        try:
            # a resumed sweep whose every job was done before still reports its grid
            if self.report and (any(counts.values()) or cell_run_ids(client.get_run(run_id))):
                out = get_method(self.report)(self.experiment, run_id, self.sweep_dir / "report")
                client.log_artifacts(run_id, str(out), "report")
                # the sweep's answer, where its user looks: not only the path to it
                print((out / "results.md").read_text(), flush=True)
                log.info("sweep report: %s (and under report/ in run %s)", out / "results.md", run_id)
        except Exception:  # a report failure must not lose the sweep's status
            log.exception("could not build the sweep report")
        failed = counts["FAILED"] + counts["KILLED"] + counts["RUNNING"]
        client.set_terminated(run_id, "FAILED" if failed else "FINISHED")
        log.info("sweep %s: %s", run_id, counts)
