"""The local SQLite store under parallel writers: no job fails on "database is locked" or on the
schema migration that parallel first opens of a fresh file race through."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

SRC = str(Path(__file__).resolve().parents[1] / "src")
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
