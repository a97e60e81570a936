"""One cache root for everything derived (converted models, extracted data, scores).

Entries are keyed by content, so a stale cache entry cannot be mistaken for a fresh one."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path:
    root = Path(os.environ.get("PRUNEBENCH_CACHE", Path.home() / ".cache" / "prunebench"))
    root.mkdir(parents=True, exist_ok=True)
    return root


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
