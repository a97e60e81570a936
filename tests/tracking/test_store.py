"""The local SQLite store under parallel writers: no job fails on "database is locked" or on the
schema migration that parallel first opens of a fresh file race through; nor when a job is signalled
in the middle of one of its writes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from prunebench.cli import exit_outside_the_store
from prunebench.tracking import interrupts, store

SRC = str(Path(__file__).resolve().parents[2] / "src")
RUNS_EACH = 10
# what a job does to the store, minus the model: create, log, search, end
WRITER = f"""
import sys
from mlflow.tracking import MlflowClient
from prunebench.tracking import store
uri = sys.argv[1]
exp_id = store.experiment_id(uri, "prunebench")
client = MlflowClient(uri)
for i in range({RUNS_EACH}):
    run = client.create_run(exp_id)
    for j in range(5):
        client.log_metric(run.info.run_id, f"task{{j}}/acc", j / 5)
        client.set_tag(run.info.run_id, "prunebench.heartbeat", str(j))
    client.search_runs([exp_id], max_results=5)
    client.set_terminated(run.info.run_id)
"""


@pytest.mark.process
def test_four_writers_on_a_fresh_sqlite_store_lose_nothing(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, uri], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(4)]
    outputs = [w.communicate(timeout=600)[0] for w in writers]
    assert [w.returncode for w in writers] == [0] * 4, "\n".join(o[-2000:] for o in outputs)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id], max_results=1000)
    assert len(runs) == 4 * RUNS_EACH and {r.info.status for r in runs} == {"FINISHED"}
    assert all(len(r.data.metrics) == 5 for r in runs)
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_tag_written_by_four_at_once_is_written(tmp_path):
    """Plain `set_tag` lost about half of these writes to the tags' primary key (UNIQUE constraint
    failed): each looks for the row before SQLite's lock is taken, at the insert."""
    uri, writers, tags = f"sqlite:///{tmp_path / 'mlflow.db'}", 4, 20
    client = MlflowClient(uri)
    run_id = client.create_run(store.experiment_id(uri, "prunebench")).info.run_id
    start = threading.Barrier(writers)

    def write(key):
        start.wait(timeout=600)
        store.set_shared_tag(client, run_id, key, "the same run")

    with ThreadPoolExecutor(writers) as pool:
        for i in range(tags):
            list(pool.map(write, [f"prunebench.cell.{i}"] * writers))
    written = client.get_run(run_id).data.tags
    assert {f"prunebench.cell.{i}" for i in range(tags)} <= written.keys()


def frame_of(*modules: str):
    """The innermost frame of calls through code of `modules` (outermost first), as the signal
    handler is handed one."""
    call = sys._getframe
    for module in reversed(modules):
        scope = {"__name__": module, "inner": call}
        exec("def call():\n    return inner()\n", scope)
        call = scope["call"]
    return call()


STORE_FRAMES = ["sqlalchemy.orm.session", "mlflow.store.tracking.sqlalchemy_store"]
HANDLERS = {signal.SIGTERM: exit_outside_the_store, signal.SIGINT: interrupts.on_sigint}


@pytest.mark.parametrize("signum", HANDLERS, ids=lambda s: s.name)
@pytest.mark.parametrize("module", STORE_FRAMES)
def test_a_signal_inside_a_store_call_comes_again_instead_of_raising_there(monkeypatch, module, signum):
    """SystemExit or KeyboardInterrupt raised inside the SQL store left its connection holding
    SQLite's write lock (the job's KILLED write and every other writer then failed, "database is
    locked"), was turned by SQLAlchemy's autoflush into an error that ended the job FAILED, or was
    swallowed by a finalizer SQLAlchemy was running: the handler lets the call return and the
    signal come again. A Ctrl-C is remembered meanwhile."""
    monkeypatch.setattr(interrupts, "received", [])
    again = threading.Event()
    monkeypatch.setattr(os, "kill", lambda pid, sent: again.set() if (pid, sent) == (os.getpid(), signum) else None)
    # the store's code calls another library's (the innermost frame): the handler looks outward
    HANDLERS[signum](signum, frame_of(module, "json.decoder"))  # returns: nothing raised
    assert again.wait(10)
    assert interrupts.received == ([signal.SIGINT] if signum == signal.SIGINT else [])


@pytest.mark.parametrize("signum", HANDLERS, ids=lambda s: s.name)
def test_a_signal_during_a_tracking_servers_call_stops_the_job_at_once(monkeypatch, signum):
    """A REST call holds no lock of the job's, and MLflow's client may retry a server that is down
    for minutes: the signal raises there (tests/tracking/test_server.py: for real)."""
    monkeypatch.setattr(interrupts, "received", [])
    monkeypatch.setattr(os, "kill", lambda *sent: pytest.fail(f"the signal was sent again: {sent}"))
    frame = frame_of("mlflow.tracking.client", "mlflow.store.tracking.rest_store", "mlflow.utils.rest_utils",
                     "mlflow.utils.request_utils", "urllib3.util.retry")
    with pytest.raises(SystemExit if signum == signal.SIGTERM else KeyboardInterrupt):
        HANDLERS[signum](signum, frame)


def test_a_signal_anywhere_else_stops_the_job_at_once(monkeypatch):
    monkeypatch.setattr(interrupts, "received", [])
    with pytest.raises(SystemExit) as ended:
        exit_outside_the_store(signal.SIGTERM, frame_of("prunebench.job", "json.decoder"))
    assert ended.value.code == 128 + signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        interrupts.on_sigint(signal.SIGINT, frame_of("prunebench.job", "json.decoder"))
    assert interrupts.stopped(RuntimeError("an error a library raised in the KeyboardInterrupt's place"))
