"""A team's tracking server for real: PostgreSQL and `mlflow server` with basic auth and proxied
artifacts, started by scripts/mlflow_server.sh on 127.0.0.1 (one per module), and prunebench's
tracking=server pointed at it. Two sweeps with two workers each lose no run and duplicate none, the
anonymous are refused, a job outlives a restart of the whole server while it logs, and artifacts
(predictions, the report's plots) go through the proxy and come back byte for byte."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import MC_FIXTURE, TINY_MC, pause_process
from prunebench.api.errors import ConfigError
from prunebench.tracking import server as tracking_server
from prunebench.tracking import store
from prunebench.tracking.sweep import CELL_TAG, record_cell

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mlflow_server.sh"
HANG_GUARD_S = 600  # only a broken build gets here: a start takes seconds, a job too
# a heartbeat (and a waiting worker's look at the key) each second: every request costs the server a
# password check, and this machine's two cores also run the jobs
JOB = [*TINY_MC, "tracking=server", "tracking.claim.heartbeat_s=1", "pruner=magnitude"]
SPARSITIES = (0.3, 0.6)  # a cell per worker of each sweep: all four workers want the baseline at once
DOCUMENTS = sum(1 for line in MC_FIXTURE.read_text().splitlines() if line.strip())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        pytest.skip("PostgreSQL's binaries are absent (/usr/lib/postgresql/*/bin; apt-get install postgresql)")
    folder = tempfile.mkdtemp(prefix="prunebench-server-")
    admin = ("admin", secrets.token_urlsafe(16))
    env = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1], "PYTHON": sys.executable}
    port = str(free_port())

    def script(command: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), command, folder, port], env=env, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 0, f"mlflow_server.sh {command}: {done.stderr[-3000:]}"
        return done.stdout

    try:
        uri = script("start").strip().split("=", 1)[1]
        # a team member, as the admin adds one; the jobs sign in as her
        member = ("alice", secrets.token_urlsafe(16))
        from mlflow.server.auth.client import AuthServiceClient

        with signed_in(admin):
            AuthServiceClient(uri).create_user(*member)
        yield SimpleNamespace(uri=uri, dir=Path(folder), member=member, admin=admin,
                              stop=lambda: script("stop"), start=lambda: script("start"))
    finally:
        script("stop")
        shutil.rmtree(folder, ignore_errors=True)  # the database's files: tens of MB per run


@contextmanager
def signed_in(user: tuple[str, str] | None):
    """MLflow's client reads the credentials from the environment at each request."""
    saved = {name: os.environ.pop(name, None) for name in tracking_server.CREDENTIALS}
    if user:
        os.environ.update(zip(tracking_server.CREDENTIALS, user))
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def job_env(server) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": server.uri, **dict(zip(tracking_server.CREDENTIALS, server.member)),
            # the jobs import this checkout, as a sweep's do
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def prunebench(server, *overrides: str, sweep: bool = False, log=subprocess.PIPE) -> subprocess.Popen:
    """A prunebench process in a folder of its own (its outputs/ and multirun/ stay out of the checkout)."""
    return subprocess.Popen([sys.executable, "-m", "prunebench", *(["-m"] if sweep else []), *JOB, *overrides], env=job_env(server),
                            cwd=tempfile.mkdtemp(prefix="prunebench-job-"), text=True, stdout=log,
                            stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, out[-5000:]
    return out


def all_runs(server):
    with signed_in(server.member):
        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name("prunebench")
        return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


@pytest.fixture(scope="module")
def swept(server):
    """Two sweeps of the same grid at once, two joblib workers each; every pruned cell needs the
    dense baseline first (tracking.ensure_dense), so all four workers contend for that key."""
    grid = [f"sparsity={','.join(map(str, SPARSITIES))}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]  # files: neither sweep blocks on a full pipe
    sweeps = [prunebench(server, *grid, f"hydra.sweep.dir={tempfile.mkdtemp(prefix='prunebench-sweep-')}",
                         sweep=True, log=log) for log in logs]
    for proc, log in zip(sweeps, logs):
        proc.wait(timeout=HANG_GUARD_S)
        log.seek(0)
        assert proc.returncode == 0, log.read()[-5000:]
    return SimpleNamespace(runs=all_runs(server))


def test_two_sweeps_with_two_workers_each_lose_no_run_and_duplicate_none(swept):
    jobs = [r for r in swept.runs if "prunebench.sweep" not in r.data.tags]
    parents = [r for r in swept.runs if "prunebench.sweep" in r.data.tags]
    finished = Counter(r.data.tags["prunebench.run_key"] for r in jobs if r.info.status == "FINISHED")
    assert len(finished) == 1 + len(SPARSITIES) and set(finished.values()) == {1}, finished
    assert not [r for r in jobs if r.info.status == "RUNNING"]
    assert [p.info.status for p in parents] == ["FINISHED", "FINISHED"]
    assert sorted(float(r.data.tags["prunebench.sparsity"]) for r in jobs if r.info.status == "FINISHED") == [0.0, *SPARSITIES]
    print("server sweeps: 2 sweeps x 2 workers,", len(jobs), "job runs", dict(Counter(r.info.status for r in jobs)),
          "distinct keys", len(finished))


def test_artifacts_round_trip_through_the_proxy(server, swept):
    jobs = [r for r in swept.runs if r.info.status == "FINISHED" and "prunebench.sweep" not in r.data.tags]
    client = MlflowClient(server.uri)
    with signed_in(server.member), tempfile.TemporaryDirectory() as out:
        for run in jobs:
            assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # through the server, not a path
            lines = Path(client.download_artifacts(run.info.run_id, "predictions/local_mc.jsonl", out)).read_text().splitlines()
            assert len(lines) == DOCUMENTS
        # a sweep whose jobs all found their keys done by the other sweep has no report
        reported = [r for r in swept.runs if r.data.tags.get("prunebench.sweep") and client.list_artifacts(r.info.run_id, "report")]
        assert reported
        for parent in reported:
            local = Path(parent.data.tags["hydra.sweep_dir"]) / "report"
            for name in ("metric_vs_sparsity.png", "results.csv"):
                fetched = Path(client.download_artifacts(parent.info.run_id, f"report/{name}", f"{out}/{parent.info.run_id}"))
                assert fetched.read_bytes() == (local / name).read_bytes()
    # the files live on the server's side, where --artifacts-destination put them
    assert list(server.dir.joinpath("artifacts").rglob("metric_vs_sparsity.png"))


def test_cells_that_share_a_run_record_it_on_the_parent_at_once(server):
    """Every pruned cell of a sweep records the dense baseline's run on the sweep's parent run, often
    in the same moment (CI saw it): of two such writes at once, PostgreSQL refused the second."""
    writers, keys = 4, 12
    runs = [SimpleNamespace(data=SimpleNamespace(tags={store.KEY_TAG: f"key{i}"}), info=SimpleNamespace(run_id=f"run{i}"))
            for i in range(keys)]
    with signed_in(server.member):
        client = MlflowClient(server.uri)
        # the client's own create: store.experiment_id would point this worker's later tests at this server
        parent = client.create_run(client.create_experiment("prunebench-cells")).info.run_id
        start = threading.Barrier(writers)

        def write(run):
            start.wait(timeout=HANG_GUARD_S)
            record_cell(server.uri, parent, run)

        with ThreadPoolExecutor(writers) as pool:
            for run in runs:
                list(pool.map(write, [run] * writers))
        tags = client.get_run(parent).data.tags
    assert {k: v for k, v in tags.items() if k.startswith(CELL_TAG)} == {CELL_TAG + f"key{i}": f"run{i}" for i in range(keys)}


def test_the_anonymous_and_a_wrong_password_are_refused(server):
    for user in (None, (server.member[0], "not-her-password")):
        with signed_in(user), pytest.raises(MlflowException, match="401"):
            MlflowClient(server.uri).search_experiments()
    # the artifact proxy too
    listed = requests.get(f"{server.uri}/api/2.0/mlflow-artifacts/artifacts", timeout=60)
    assert listed.status_code == 401


def job_meeting_a_stopped_server(server, sparsity: str, *overrides: str) -> subprocess.Popen:
    """A job at `sparsity`, paused inside its run (claimed, parameters logged, metrics still to
    come) while the whole server stops, then resumed: its next request meets the stopped server."""
    job = prunebench(server, f"sparsity={sparsity}", "tracking.ensure_dense=false", *overrides)
    try:
        while not [r for r in all_runs(server) if r.data.tags.get("prunebench.sparsity") == sparsity
                   and r.info.status == "RUNNING" and r.data.params]:
            assert job.poll() is None, job.communicate()[0][-5000:]
            time.sleep(0.2)
        pause_process(job)
        server.stop()
    finally:
        os.kill(job.pid, signal.SIGCONT)
    return job


def test_a_job_survives_a_server_restart_in_the_middle_of_logging(server):
    job = job_meeting_a_stopped_server(server, "0.9")
    seen = []
    for line in job.stdout:  # its next request (a heartbeat within 1 s) meets the stopped server
        seen.append(line)
        if "Retrying (" in line:
            break
    else:
        raise AssertionError("the job never retried against the stopped server:\n" + "".join(seen)[-5000:])
    server.start()
    out = "".join(seen) + finish(job)
    (run,) = [r for r in all_runs(server) if r.data.tags.get("prunebench.sparsity") == "0.9"]
    assert run.info.status == "FINISHED", out[-5000:]
    assert "local_mc/acc" in run.data.metrics and "avg/score" in run.data.metrics


def test_ctrl_c_while_the_server_is_down_stops_the_job_at_once_and_its_run_ends_killed(server):
    """Ctrl-C during MLflow's retries against a stopped server interrupts them (they would wait
    minutes, tracking.http): the job ends its run KILLED, written once the server is back. No
    heartbeat: every retry is the job's own call."""
    job = job_meeting_a_stopped_server(server, "0.8", "tracking.claim.heartbeat_s=3600")
    seen, interrupted = [], False
    # a job that waits out its retries instead never says KILLED while the server is down: stopped
    # here long before them (its log ends, and the test fails naming what it printed)
    guard = threading.Timer(120, job.kill)
    guard.start()
    try:
        for line in job.stdout:
            seen.append(line)
            if "Retrying (" in line and not interrupted:
                job.send_signal(signal.SIGINT)
                interrupted = True
            if "KILLED " in line:  # the job's error line, logged before it writes KILLED to the store
                break
        else:
            raise AssertionError("the job never said KILLED while the server was down:\n" + "".join(seen)[-5000:])
    finally:
        guard.cancel()
        server.start()
    out, _ = job.communicate(timeout=HANG_GUARD_S)
    assert job.returncode != 0, out[-5000:]
    (run,) = [r for r in all_runs(server) if r.data.tags.get("prunebench.sparsity") == "0.8"]
    assert run.info.status == "KILLED", "".join(seen)[-3000:] + out[-3000:]


def tracking(**http) -> OmegaConf:
    return OmegaConf.create({"uri": "http://127.0.0.1:5000", "http": {"max_retries": 10, **http}})


def test_server_settings_are_checked_before_a_job_starts(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    tracking_server.check(tracking())
    with pytest.raises(ConfigError, match="tracking.uri='sqlite:///x.db'"):
        tracking_server.check(OmegaConf.create({"uri": "sqlite:///x.db", "http": {}}))
    with pytest.raises(ConfigError, match="holds a sign-in"):
        tracking_server.check(OmegaConf.create({"uri": "http://alice:secret@host:5000", "http": {}}))
    with pytest.raises(ConfigError, match=r"max_retries=11: use an integer \[0, 10\]"):
        tracking_server.check(tracking(max_retries=11))
    with pytest.raises(ConfigError, match="backoff_factor=0.5: use an integer"):
        tracking_server.check(tracking(backoff_factor=0.5))
    with pytest.raises(ConfigError, match="tracking.http.retries is not a setting"):
        tracking_server.check(tracking(retries=3))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_PASSWORD is not"):
        tracking_server.check(tracking())
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")  # restored when the test ends
    tracking_server.export_http_settings(tracking(max_retries=3))
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"


def test_tracking_server_composes_with_the_local_settings_and_its_retries():
    from conftest import compose_cfg

    cfg = compose_cfg(["tracking=server", "tracking.uri=http://mlflow.example.org:5000"])
    assert cfg.tracking.uri == "http://mlflow.example.org:5000" and cfg.tracking.claim.stale_s == 300
    assert cfg.tracking.http.max_retries == 10 and cfg.tracking.skip_existing
