"""One MLflow parent run per Hydra multirun, closed with the right status even when a job fails.

Hydra skips `on_multirun_end` when a job raised, so the parent is also closed at interpreter exit.
Children find the parent through an environment variable, which joblib workers inherit. The
sweep's report is built by the function the config names (`report`), so tracking imports nothing
of the report, which reads tracking's runs.

A detached sweep (`detach=true`: the submitting process returns once SLURM has the
array) is closed by whichever process finds every cell ended: the last job to end, or
`prunebench-status`. Exactly one closes it: closing begins by logging the parameter
`prunebench.closed_by` with a value of the closer's own. MLflow parameters cannot change once
logged and the SQL stores (SQLite, a tracking server's PostgreSQL) enforce it with the parameters'
primary key, so of two closers that try at once the second's write is refused: the compare-and-set
MLflow offers nowhere else.

A sweep that is not detached is closed by its own process, at its end or at exit (Ctrl-C, SIGTERM).
One killed outright (SIGKILL, a node lost) cannot: its parent records the process and the grid
(`cells`), so that the next `prunebench-status`, or the next sweep in the experiment, finds the
process gone, ends its jobs' runs KILLED and closes the parent with the real counts."""

from __future__ import annotations

import atexit
import logging
import os
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback
from hydra.utils import get_method
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError, refuse
from prunebench.tracking import cells, claim, interrupts, server, store

log = logging.getLogger(__name__)
PARENT_ENV = "PRUNEBENCH_SWEEP_RUN_ID"
# a tag on the parent per grid cell answered by a run made earlier (a skipped job, a dense baseline
# already in the store): with the parent's children, the sweep's report covers its whole grid
CELL_TAG = "prunebench.cell."
DETACHED_TAG = "prunebench.detached"
# what a closer of a detached sweep needs that only the submitting process's config knew
REPORT_TAG, STALE_TAG = "prunebench.report", "prunebench.stale_s"
CLOSER_PARAM = "prunebench.closed_by"
# set once the launcher has handed every cell to SLURM: before it, no cell count is complete
SUBMITTED_TAG = "prunebench.submitted"
DETACHABLE = "hydra_plugins.prunebench_launcher.detachable_launcher.DetachableSlurmLauncher"
DEFAULT_STALE_S = 300.0  # conf/tracking's claim.stale_s, for a reader without the sweep's config


def record_cell(uri: str, parent_run_id: str, run) -> None:
    """Each cell writes its own tag, so parallel jobs never overwrite each other's; cells that share a
    run (the dense baseline every pruned cell needs) write the same one, at times at once."""
    store.set_shared_tag(MlflowClient(uri), parent_run_id, CELL_TAG + run.data.tags[store.KEY_TAG], run.info.run_id)


def cell_run_ids(parent) -> list[str]:
    return [value for key, value in parent.data.tags.items() if key.startswith(CELL_TAG)]


class SweepRunCallback(Callback):
    """`report`: import path of a function (experiment, sweep run id, folder) -> the folder it wrote;
    its files are logged to the parent run under report/ (None: no report). `planner`: import path
    of a function (the sweep's config) -> exit status, which prints the grid under plan=true.
    `checker`: import path of a function (the sweep's config) raising ConfigError for what every job
    shares (validate.check_sweep), so the sweep is refused once instead of each job. `grid`: import
    path of a function (the sweep's config) -> each job's overrides (plan.sweep_grid), recorded so a
    cell never started reads "left". All four are named in the config so that tracking imports
    nothing above it."""

    def __init__(self, report: str | None = None, planner: str | None = None, checker: str | None = None,
                 grid: str | None = None) -> None:
        self.report, self.planner, self.checker, self.grid = report, planner, checker, grid
        self.run_id: str | None = None
        self.submitted = False
        self.ended = False  # Hydra reached on_multirun_end: every job was launched

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.get("plan"):  # the plan, and no parent run: a plan leaves the store as it was
            # the plan is all a plan=true sweep does: stop before Hydra launches (and makes folders for) its jobs
            raise SystemExit(get_method(self.planner)(config))
        if self.checker:
            try:
                get_method(self.checker)(config)
            except ConfigError as err:  # a job refused alike
                refuse(err)
        server.check(config.tracking)  # before the sweep's first request: a job would refuse the same
        server.export_http_settings(config.tracking)
        uri = store.tracking_uri(config.tracking.uri)
        try:
            store.check_uri(uri)
        except ConfigError as err:  # Hydra would only warn of a callback's exception and run every job into it
            refuse(err)
        self.uri, self.experiment = uri, config.tracking.experiment
        # absolute: a detached sweep's closer may run in another working directory
        self.sweep_dir = Path(config.hydra.sweep.dir).absolute()  # HydraConfig is not set yet here
        self.stale_s = config.tracking.claim.stale_s
        self.detached = bool(config.get("detach"))
        if self.detached and config.hydra.launcher.get("_target_") != DETACHABLE:
            refuse(f"detach=true needs hydra/launcher=prunebench_slurm or slurm_gpu (the launcher that returns "
                   f"once SLURM has the array), not {config.hydra.launcher.get('_target_')}")
        exp_id = store.experiment_id(uri, self.experiment)
        close_orphans(uri, exp_id, self.stale_s)  # earlier sweeps whose process was killed outright
        overrides = " ".join(config.hydra.overrides.task)
        detached = {DETACHED_TAG: "true", REPORT_TAG: self.report or "", STALE_TAG: str(self.stale_s)}
        # who runs a local sweep's jobs: once it is gone, its cells not started are left, and anyone closes it
        local = {cells.SWEEP_WORKER_TAG: claim.worker_id(), REPORT_TAG: self.report or "", STALE_TAG: str(self.stale_s)}
        run = MlflowClient(uri).create_run(exp_id, run_name=f"sweep {self.sweep_dir.name}", tags={
            "prunebench.sweep": "true", "hydra.overrides": overrides, "hydra.sweep_dir": str(self.sweep_dir),
            "git.sha": store.git_sha(), **(detached if self.detached else local)})
        self.run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.run_id
        # a detached sweep outlives this process (its cells close it) unless its submission failed
        atexit.register(self.abandon if self.detached else self.close)
        # every cell of a sweep that launches them all reaches a job (a skipped one too); prunebench's
        # SLURM launcher submits only the cells left, and records the others itself
        if not self.detached and config.hydra.launcher.get("_target_") != DETACHABLE:
            grid = local_grid(config, self.grid)
            cells.record_array(MlflowClient(uri), self.run_id, {n: {"overrides": o, "local": True}
                                                               for n, o in enumerate(grid)})
        log.info("sweep parent run %s", self.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.ended = True
        if not self.detached:
            self.close()
            return
        MlflowClient(self.uri).set_tag(self.run_id, SUBMITTED_TAG, "true")
        self.submitted = True
        # every cell may have ended already (or none was left to submit): then no job closes it
        close_if_done(self.uri, self.run_id, self.stale_s)
        parent = MlflowClient(self.uri).get_run(self.run_id)
        arrays = cells.numbered(parent.data.tags, cells.ARRAY_TAG)
        jobs = sorted({a["slurm"].split("_")[0] for a in arrays.values() if a.get("slurm")})
        print(f"sweep submitted, detached: parent run {self.run_id}\n"
              f"SLURM job {', '.join(jobs) or '(none: every cell is done or running elsewhere)'}: "
              f"{len(arrays)} cell(s) submitted, {len(cell_run_ids(parent))} answered by runs already in the store\n"
              f"state: prunebench-status {self.run_id} --uri {absolute_uri(self.uri)}\n"
              f"report: written by the last cell to end, to {self.sweep_dir / 'report'} and under report/ "
              f"in the parent run", flush=True)

    def abandon(self) -> None:
        """A detached sweep whose submission broke off (sbatch refused, Ctrl-C) ends FAILED here:
        no cell of it would ever close it."""
        if self.run_id is not None and not self.submitted:
            client = MlflowClient(self.uri)
            client.set_tag(self.run_id, "prunebench.error", "the submission did not complete")
            client.set_terminated(self.run_id, "FAILED")

    def close(self) -> None:
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        os.environ.pop(PARENT_ENV, None)
        close_sweep(self.uri, run_id, self.experiment, self.report, self.sweep_dir, self.stale_s,
                    interrupted=not self.ended)


def local_grid(config: DictConfig, expand: str | None) -> list[str]:
    """Each job's overrides, by job number, as Hydra's basic sweeper will launch them: `expand`, the
    import path of a function (the sweep's config) -> the jobs' overrides (plan.sweep_grid, the
    sweeper's own expansion); [] under another sweeper, or a sweep that does not expand (the sweeper
    then refuses it itself)."""
    if not expand or OmegaConf.select(config, "hydra.runtime.choices.hydra/sweeper") != "basic":
        return []
    try:
        return [" ".join(job) for job in get_method(expand)(config)]
    except Exception:
        log.debug("the sweep's grid could not be expanded here", exc_info=True)
        return []


def end_gone_claims(client: MlflowClient, run_id: str, experiment_id: str, stale_s: float) -> None:
    """A cell killed outright left its run RUNNING: ended KILLED here, by the claims' rules."""
    for run in client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}' and "
                                                   "attributes.status = 'RUNNING'", max_results=1000):
        claim.end_if_gone(client, run, claim.worker_id(), stale_s)


def close_orphans(uri: str, experiment_id: str, stale_s: float) -> None:
    """Closes the experiment's RUNNING sweeps that are not detached and whose process is gone (killed
    outright): their jobs' runs end KILLED, the parents close with their counts. A failure is logged:
    it never stops the sweep that looks."""
    client = MlflowClient(uri)
    try:
        for parent in client.search_runs([experiment_id], "tags.`prunebench.sweep` = 'true' and "
                                                          "attributes.status = 'RUNNING'", max_results=100):
            if parent.data.tags.get(DETACHED_TAG) != "true" and cells.sweep_gone(parent):
                own = float(parent.data.tags.get(STALE_TAG, stale_s))
                end_gone_claims(client, parent.info.run_id, experiment_id, own)
                close_if_done(uri, parent.info.run_id, own)
    except Exception:
        log.exception("could not close the earlier sweeps whose process is gone")


def close_sweep(uri: str, run_id: str, experiment: str, report: str | None, sweep_dir: Path, stale_s: float,
                interrupted: bool = False) -> None:
    """FINISHED when every child finished; FAILED (documented) when any child failed or was
    killed, or the sweep stopped short (`interrupted`: its process ended before Hydra's end of the
    sweep; cells of its grid never started, counted as `left`), with counts in tags. A cell killed
    before it made its run (Ctrl-C at launch) counts as killed from its own state on the parent. An
    attempt that ended FAILED or KILLED (a requeue's, a preemption's) whose run key a later attempt
    in this sweep FINISHED is counted apart, as `retried`: its cell has its result. Then the sweep's
    report is logged to the parent."""
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'", max_results=5000)
    # a job killed outright (SIGKILL, scancel) could not end its own run
    ended = {c.info.run_id for c in children if c.info.status == "RUNNING"
             and claim.end_if_gone(client, c, claim.worker_id(), stale_s)}
    statuses = ["KILLED" if c.info.run_id in ended else c.info.status for c in children]
    done = {c.data.tags.get(store.KEY_TAG) for c, status in zip(children, statuses) if status == "FINISHED"}
    statuses = ["RETRIED" if status in ("FAILED", "KILLED") and c.data.tags.get(store.KEY_TAG) in done else status
                for c, status in zip(children, statuses)]
    counts = {s: statuses.count(s) for s in ("FINISHED", "FAILED", "KILLED", "RUNNING", "RETRIED")}
    jobs, arrays = cells.numbered(parent.data.tags, cells.JOB_TAG), cells.numbered(parent.data.tags, cells.ARRAY_TAG)
    # a job tag still RUNNING here is a job whose process is gone (its closer is not it)
    counts["KILLED"] = max(counts["KILLED"], sum(j.get("state") in (cells.KILLED, "RUNNING") for j in jobs.values()))
    counts["LEFT"] = sum(num not in jobs for num, array in arrays.items() if array.get("local"))
    if counts["LEFT"] or (interrupted and not counts["FAILED"]):
        client.set_tag(run_id, "prunebench.error", f"the sweep stopped before its end: {counts['LEFT']} cell(s) "
                                                   "never started (the same command again runs what is left)")
    for status, n in counts.items():
        client.set_tag(run_id, f"prunebench.jobs_{status.lower()}", str(n))
    try:
        # a resumed sweep whose every job was done before still reports its grid
        if report and (counts["FINISHED"] or counts["FAILED"] or cell_run_ids(client.get_run(run_id))):
            out = get_method(report)(experiment, run_id, sweep_dir / "report")
            client.log_artifacts(run_id, str(out), "report")
            describe(client, run_id, (out / "results.md").read_text())
            # the sweep's answer, where its user looks: not only the path to it
            print((out / "results.md").read_text(), flush=True)
            log.info("sweep report: %s (and under report/ in run %s)", out / "results.md", run_id)
    except Exception:  # a report failure must not lose the sweep's status
        log.exception("could not build the sweep report")
    failed = counts["FAILED"] + counts["KILLED"] + counts["RUNNING"] + counts["LEFT"]
    client.set_terminated(run_id, "FAILED" if failed or interrupted else "FINISHED")
    log.info("sweep %s: %s", run_id, counts)


# MLflow keeps a tag value of at most 8,000 characters; the description is cut below that
DESCRIPTION_CHARS = 7000
# what the run page shows folded (its first lines, above "Show more"): where the rest is
WHERE = ("Sweep report. The jobs: **Model training** at the top of the UI, then this run's row in the runs table, "
         "unfolded by its +. The whole report and its plots: **Artifacts**, `report/`.")
# results.md's plots, `![name](file.png)`, are relative to its folder, which the run page does not resolve
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def describe(client: MlflowClient, run_id: str, report: str) -> None:
    """The report's table as the sweep's run description (`mlflow.note.content`, Markdown that the
    run page shows under "Description"), where the UI otherwise says "No description". Where the
    jobs and plots are comes first, in the lines shown before "Show more"; each plot is named by
    its artifact path, since an embedded one drew a broken image."""
    report = IMAGE.sub(lambda m: f"({m[1]}: Artifacts, `report/{m[2]}`)", report)
    room = DESCRIPTION_CHARS - len(WHERE) - 2
    if len(report) > room:
        report = report[:room - 45].rsplit("\n", 1)[0] + "\n\n(cut here: report/results.md has it all)"
    client.set_tag(run_id, "mlflow.note.content", f"{WHERE}\n\n{report}")


def absolute_uri(uri: str) -> str:
    """A SQLite store named relative to this working directory, named so that any directory reaches it."""
    return f"sqlite:///{Path(uri[len('sqlite:///'):]).absolute()}" if uri.startswith("sqlite:///") else uri


def close_if_done(uri: str, run_id: str, stale_s: float) -> bool:
    """Closes a detached sweep whose every cell has ended, or a local one whose process is gone, if
    this process wins the closing (the module's docstring); True when it closed it."""
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    tags = parent.data.tags
    if parent.info.status != "RUNNING" or CLOSER_PARAM in parent.data.params:
        return False
    if tags.get(DETACHED_TAG) == "true" and tags.get(SUBMITTED_TAG) != "true":
        return False
    # a local sweep is its process's to close while it lives
    if tags.get(DETACHED_TAG) != "true" and (cells.SWEEP_WORKER_TAG not in tags or not cells.sweep_gone(parent)):
        return False
    stale_s = float(parent.data.tags.get(STALE_TAG, stale_s))
    if not all(cell.ended for cell in cells.read_cells(client, run_id, stale_s)):
        return False
    me = f"{claim.worker_id()} {uuid.uuid4().hex[:8]}"
    try:
        client.log_param(run_id, CLOSER_PARAM, me)
    except MlflowException:  # another closer's value is there: it closes
        pass
    if client.get_run(run_id).data.params.get(CLOSER_PARAM) != me:
        return False
    log.info("the sweep's last cell has ended: closing sweep %s", run_id)
    import mlflow

    mlflow.set_tracking_uri(uri)  # the report reads the store through MLflow's fluent API
    close_sweep(uri, run_id, client.get_experiment(parent.info.experiment_id).name,
                parent.data.tags.get(REPORT_TAG) or None, Path(parent.data.tags["hydra.sweep_dir"]), stale_s)
    return True


class JobEnd:
    """What a job that returned did: ran its cell, or found it done (`skipped`)."""
    skipped = False


@contextmanager
def job_state(uri: str, parent_run_id: str, num: int, overrides: str, stale_s: float):
    """Around one sweep job: its state on the parent (`cells`), then, when its sweep is detached,
    the sweep's closing if this was its last cell to end. A job stopped by a signal (KILLED) may be
    requeued, so it never closes: the next job to end or `prunebench-status` does."""
    client = MlflowClient(uri)
    state = {"state": "RUNNING", "worker": claim.worker_id(), "start": time.time(), "overrides": overrides}
    cells.job_tag(client, parent_run_id, num, state)
    end = JobEnd()
    try:
        yield end
        interrupts.check()  # a Ctrl-C a library swallowed: the job and the sweep stop here
    except BaseException as err:
        if interrupts.stopped(err):
            cells.job_tag(client, parent_run_id, num, {**state, "state": cells.KILLED, "end": time.time()})
            raise
        cells.job_tag(client, parent_run_id, num, {**state, "state": cells.FAILED, "end": time.time(),
                                                   "error": f"{type(err).__name__}: {err}"[:1000]})
        close_quietly(uri, parent_run_id, stale_s)
        raise
    cells.job_tag(client, parent_run_id, num, {**state, "state": "SKIPPED" if end.skipped else "FINISHED",
                                               "end": time.time()})
    close_quietly(uri, parent_run_id, stale_s)


def close_quietly(uri: str, run_id: str, stale_s: float) -> None:
    """A job's closing attempt: a failure is logged, never the job's own outcome (a status call or
    the next job closes the sweep instead)."""
    try:
        close_if_done(uri, run_id, stale_s)
    except Exception:
        log.exception("could not check whether sweep %s has ended", run_id)
