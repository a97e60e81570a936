"""One cache root for everything derived (converted models, extracted data, scores).

Entries are keyed by content, so a stale cache entry cannot be mistaken for a fresh one."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_location() -> Path:
    return Path(os.environ.get("PRUNEBENCH_CACHE", Path.home() / ".cache" / "prunebench")).expanduser()


def cache_root() -> Path:
    root = cache_location()
    root.mkdir(parents=True, exist_ok=True)
    return root


def check_writable(folder: Path | str) -> None:
    """OSError naming the folder and the cause unless this process can make `folder` and write in
    it: tried, since the mode bits (os.access) say yes to root under /proc or on a read-only mount.
    Nothing is left behind: a folder still missing is tried at its nearest existing parent."""
    folder = Path(folder).expanduser().absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{existing} is a file, not a folder")
    try:
        tempfile.TemporaryDirectory(dir=existing, prefix=".prunebench-probe-").cleanup()
    except OSError as err:
        raise OSError(f"nothing can be written in {existing} ({err.strerror or type(err).__name__})") from None


def check_cache() -> None:
    """ValueError unless the cache root can be made and written: a job's first write there (lm-eval's
    local data, a converted model, pruning scores, judge replies) comes deep inside its work."""
    root = cache_location()
    try:
        check_writable(root)
    except OSError as err:
        named = (f"PRUNEBENCH_CACHE={os.environ['PRUNEBENCH_CACHE']!r}" if "PRUNEBENCH_CACHE" in os.environ
                 else f"the prunebench cache {str(root)!r} (PRUNEBENCH_CACHE unset)")
        raise ValueError(f"{named}: {err}; set PRUNEBENCH_CACHE to a folder this process can write (converted "
                         f"models, local lm-eval data, pruning scores and judge replies are kept there)") from None


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_key(obj) -> str:
    """Stable short hash of a JSON-able object (dict order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """A downloaded or installed file's sha256, read in 1 MiB blocks (a GGUF or an sdist is hundreds of MB)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_cache_root() -> None:
    """`check_cache`'s refusal as a config error (the cache folder is `PRUNEBENCH_CACHE`'s)."""
    from prunebench.api.errors import ConfigError

    try:
        check_cache()
    except ValueError as err:
        raise ConfigError(str(err)) from None
