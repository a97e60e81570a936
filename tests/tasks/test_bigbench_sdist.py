"""Getting BIG-bench's task JSON: over a real HTTP index (a local server in PEP 503's layout), from a
user's copy, and the errors a machine without either gets, before any model loads."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import tarfile
import threading

import pytest

from conftest import compose_cfg
from prunebench.tasks import bigbench_sdist
from prunebench.validate import ConfigError, validate

TASK = {"name": "tiny", "examples": [{"input": "2+2?", "target_scores": {"4": 1, "5": 0}}]}


def sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        blob = json.dumps(TASK).encode()
        info = tarfile.TarInfo(f"{bigbench_sdist.PROJECT}-{bigbench_sdist.VERSION}/bigbench/benchmark_tasks/tiny/task.json")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(bigbench_sdist.SDIST_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A package index on loopback holding a small stand-in sdist; its sha256 replaces PyPI's."""
    root = tmp_path / "index"
    (root / "simple" / "bigbench").mkdir(parents=True)
    (root / "files").mkdir()
    blob = sdist_bytes()
    (root / "files" / bigbench_sdist.SDIST).write_bytes(blob)
    digest = hashlib.sha256(blob).hexdigest()
    (root / "simple" / "bigbench" / "index.html").write_text(
        f'<html><body><a href="../../files/{bigbench_sdist.SDIST}#sha256={digest}">{bigbench_sdist.SDIST}</a>'
        f'<a href="../../files/bigbench-0.0.1.tar.gz">bigbench-0.0.1.tar.gz</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(bigbench_sdist, "SHA256", digest)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    yield root
    server.shutdown()


def test_downloads_once_over_the_simple_index_and_extracts(cache, index):
    path, = bigbench_sdist.extract(["tiny/task.json"])
    assert json.loads(path.read_text()) == TASK
    assert (cache / "downloads" / bigbench_sdist.SDIST).is_file()
    (index / "files" / bigbench_sdist.SDIST).unlink()   # the cached copy serves every later call
    path.unlink()
    assert json.loads(bigbench_sdist.extract(["tiny/task.json"])[0].read_text()) == TASK


def test_a_download_with_another_hash_is_refused_and_not_kept(cache, index, monkeypatch):
    monkeypatch.setattr(bigbench_sdist, "SHA256", "0" * 64)
    with pytest.raises(bigbench_sdist.BigBenchUnavailable, match="sha256") as err:
        bigbench_sdist.sdist()
    assert bigbench_sdist.SDIST_ENV in str(err.value)
    assert list((cache / "downloads").iterdir()) == []


def test_an_unreachable_index_says_how_to_provide_the_file(cache, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")   # port 9 (discard) refuses
    with pytest.raises(bigbench_sdist.BigBenchUnavailable) as err:
        bigbench_sdist.sdist()
    message = str(err.value)
    assert "http://127.0.0.1:9/simple" in message and bigbench_sdist.SDIST_ENV in message
    assert str(cache / "downloads" / bigbench_sdist.SDIST) in message


def test_a_users_copy_is_used_and_checked(cache, tmp_path, monkeypatch):
    copy = tmp_path / bigbench_sdist.SDIST
    copy.write_bytes(sdist_bytes())
    monkeypatch.setattr(bigbench_sdist, "SHA256", hashlib.sha256(copy.read_bytes()).hexdigest())
    monkeypatch.setenv(bigbench_sdist.SDIST_ENV, str(copy))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")   # never asked
    assert json.loads(bigbench_sdist.extract(["tiny/task.json"])[0].read_text()) == TASK
    copy.write_bytes(b"not a tarball")
    with pytest.raises(bigbench_sdist.BigBenchUnavailable, match="sha256 differs"):
        bigbench_sdist.sdist()
    monkeypatch.setenv(bigbench_sdist.SDIST_ENV, str(tmp_path / "missing.tar.gz"))
    with pytest.raises(bigbench_sdist.BigBenchUnavailable, match="is not a file"):
        bigbench_sdist.sdist()


@pytest.mark.parametrize("task", ["bb_general_knowledge", "bbh_zeroshot"])
def test_bigbench_tasks_fail_validation_when_the_sdist_cannot_be_had(cache, monkeypatch, task):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    overrides = ["model=tiny-llama", f"task={task}"]
    if task == "bbh_zeroshot":
        overrides += ["task.tasks.bbh_zeroshot.source=bigbench", "task.tasks.bbh_zeroshot.subtasks=[navigate]"]
    with pytest.raises(ConfigError, match=bigbench_sdist.SDIST_ENV):
        validate(compose_cfg(overrides))
