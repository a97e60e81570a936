"""One job's MLflow run: skip when already FINISHED, FAILED with its traceback when it breaks."""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import subprocess
import traceback
from contextlib import contextmanager
from pathlib import Path

import mlflow
from filelock import FileLock
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from prunebench.api.errors import ConfigError
from prunebench.tracking import interrupts

log = logging.getLogger(__name__)
KEY_TAG = "prunebench.run_key"
# {task: why it has no headline number}: headline.withheld_tasks writes it, the reports name it
WITHHELD_TAG = "prunebench.withheld"


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def artifact_root(uri: str) -> str | None:
    """Artifacts beside a SQLite store (mlartifacts/ next to mlflow.db), so one folder holds both."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return None


@functools.cache
def prepare_sqlite(uri: str) -> None:
    """MLflow creates and migrates a fresh SQLite file when a process first opens it, and parallel
    first opens race ("duplicate column name"): they take turns, under a file lock beside the store.
    WAL mode (kept in the file) lets readers (searches, reports, heartbeats) and a writer overlap;
    writers then wait for each other under MLflow's busy timeout instead of failing."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        MlflowClient(uri).search_experiments(max_results=1)
        with sqlite3.connect(path, timeout=60) as db:
            db.execute("PRAGMA journal_mode=WAL")


def experiment_id(uri: str, name: str) -> str:
    """Create-or-get that tolerates a parallel job creating the same experiment first."""
    prepare_sqlite(uri)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root(uri))
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def set_shared_tag(client: MlflowClient, run_id: str, key: str, value: str) -> None:
    """For a tag that two processes may write at the same moment (a sweep's dense baseline, recorded
    by each pruned cell; a dead worker's claim, ended by each waiter that finds it). MLflow's SQL
    store sets a tag by looking for its row and inserting one when none is there, so of two such
    writes at once the second insert breaks the tags' primary key and is refused (PostgreSQL; SQLite
    too, its lock taken only at the insert). The row is then committed: written again, it is updated."""
    try:
        client.set_tag(run_id, key, value)
    except MlflowException:
        client.set_tag(run_id, key, value)


def finished_run(uri: str, exp_id: str, key: str):
    runs = MlflowClient(uri).search_runs(
        [exp_id], filter_string=f"tags.`{KEY_TAG}` = '{key}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def failed_run(uri: str, exp_id: str, key: str, parent_run_id: str):
    """The newest FAILED run of `key` under a sweep's parent, or None."""
    runs = MlflowClient(uri).search_runs(
        [exp_id], filter_string=f"tags.`{KEY_TAG}` = '{key}' and attributes.status = 'FAILED' "
                                f"and tags.`mlflow.parentRunId` = '{parent_run_id}'",
        order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


@contextmanager
def job_run(claim, run_name: str):
    """Yields the claimed run (`claim.Claim`), active; an exception ends it FAILED (KILLED on
    interrupt) with the traceback logged, so no run is ever left RUNNING. A run whose claim was lost
    meanwhile (`claim.lost_to`) does not end FINISHED: taken over, it stays KILLED; beaten by an
    overlapping run of its key, it is deleted, so the key keeps one FINISHED run."""
    # the run's own experiment made active: MLflow refuses to resume a run of another experiment than
    # the one a caller (a notebook, an earlier job of this process) set active
    mlflow.set_experiment(experiment_id=claim.exp_id)
    run = mlflow.start_run(run_id=claim.run_id)
    try:
        with claim.heartbeat():
            yield run
        interrupts.check()  # a Ctrl-C a library swallowed: not FINISHED
    except BaseException as err:
        status = "KILLED" if interrupts.stopped(err) else "FAILED"
        log.error("%s %s: %s: %s (run %s)", status, run_name, type(err).__name__, err, run.info.run_id)
        try:
            mlflow.log_text(traceback.format_exc(), "traceback.txt")
            mlflow.set_tag("prunebench.error", f"{type(err).__name__}: {err}"[:5000])
        finally:
            mlflow.end_run(status)
        raise
    lost = claim.lost_to()
    mlflow.end_run("FINISHED" if lost is None else "KILLED")
    if lost:
        reason, duplicate = lost
        log.warning("%s: not recorded FINISHED, %s", run_name, reason)
        if duplicate:
            claim.client.delete_run(claim.run_id)


def check_uri(uri: str) -> None:
    """An address MLflow has no store for (a typo'd scheme) fails here, before a run's setup, not as
    MLflow's traceback; a SQLite file is opened later, under `prepare_sqlite`'s first-migration lock."""
    if uri.startswith("sqlite:///"):
        return
    try:
        MlflowClient(uri)
    except MlflowException as err:
        reason = str(err).strip().split(". ")[0]
        raise ConfigError(f"tracking.uri={uri!r}: MLflow cannot open it ({reason}); use sqlite:///FILE.db, "
                          f"a folder, or http(s)://HOST:PORT of an MLflow server") from None


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def missing_store(uri: str) -> str | None:
    """Why a command that only reads (report, compare, status) has nothing to read at `uri`: a SQLite
    file or a store folder that does not exist, which MLflow would create empty (with its folder).
    None where it exists, or for a server (which says so itself)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
    elif uri.startswith("file:") or "://" not in uri:
        path = Path(uri.removeprefix("file://").removeprefix("file:"))
    else:
        return None
    if path.exists():
        return None
    return (f"no MLflow store at {uri} ({path.resolve()} does not exist); name an existing one with "
            f"--tracking-uri or MLFLOW_TRACKING_URI")


def record_invalid(cfg, overrides, parent_run_id: str, err: ConfigError) -> None:
    """A sweep's job refused by validation still counts: a FAILED run under the sweep's parent,
    carrying the message, so the parent's jobs_failed and the UI show it. Nothing loaded, nothing
    else logged; a store that cannot be reached leaves the console's message as the record."""
    from omegaconf import OmegaConf

    try:
        uri = tracking_uri(cfg.tracking.uri)
        client = MlflowClient(uri)
        names = [str(OmegaConf.select(cfg, f"{group}.name", default="?")) for group in ("model", "pruner", "task")]
        created = client.create_run(experiment_id(uri, cfg.tracking.experiment), run_name="|".join(names) + " (invalid)",
                                    tags={"mlflow.parentRunId": parent_run_id, "hydra.overrides": " ".join(overrides),
                                          "prunebench.error": f"ConfigError: {err}"[:5000]})
        client.set_terminated(created.info.run_id, "FAILED")
    except Exception:  # the config error is what the user must see, not a second one about the store
        log.exception("could not record the invalid job in the store")
