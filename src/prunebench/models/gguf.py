"""A GGUF shipped on PyPI, dequantised once into a safetensors folder in the prunebench cache.

Dequantising takes tens of seconds; the converted folder loads in a few, so every job after the
first pays only the fast path. The folder is keyed by the GGUF's sha256, so a new release of the
package converts anew and an old folder is never mistaken for it."""

from __future__ import annotations

import logging
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock

from prunebench.cache import cache_dir, cache_location

log = logging.getLogger(__name__)

# the folder-name tag of each dtype a converted folder is saved in
DTYPE_TAGS = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def converted(label: str, sha256: str, dtype: torch.dtype, gguf_file: Callable[[], AbstractContextManager[Path]],
              needed_bytes: int) -> Path:
    """`gguf_file` opens the GGUF for the conversion (assembling it first where the package ships it
    in parts, removing it after); `needed_bytes` is what that and the folder write under the cache."""
    out = converted_folder(label, sha256, dtype)
    if (out / "config.json").exists():
        return out
    cache_dir("models")  # made here, where the lock goes
    # jobs started together on an empty cache (a SLURM array, pytest-xdist's workers) convert once:
    # the others wait here, then find the folder
    with FileLock(f"{out}.lock"):
        if not (out / "config.json").exists():
            check_free_space(out.parent, needed_bytes, label)
            with gguf_file() as gguf:
                convert(gguf, out, dtype)
    return out


def converted_folder(label: str, sha256: str, dtype: torch.dtype) -> Path:
    """Where `converted` writes the folder (not made here: a plan looks for it, models/stated.py)."""
    return cache_location() / "models" / f"{label}-{DTYPE_TAGS[dtype]}-{sha256[:12]}"


def convert(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Only under the caller's lock: the .tmp folder is one per cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a %s safetensors folder (once)", gguf, DTYPE_TAGS[dtype])
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A dequantised GGUF model still carries its quantizer; saving needs it gone.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(dtype).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)


def check_free_space(folder: Path, needed: int, label: str) -> None:
    """Before the dequantising, not at its last write: whatever the conversion writes must fit (a
    full disk otherwise fails every job of a sweep in turn, late)."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(f"converting {label} needs about {needed / 1e9:.2f} GB free under {folder}, which has "
                      f"{free / 1e9:.2f} GB: free some space there, or set PRUNEBENCH_CACHE to a folder on a "
                      f"larger disk")


# GGUF metadata value types: the struct format of each fixed-size one; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_metadata(gguf: Path, prefix: str) -> dict[str, object]:
    """The header's string and scalar values whose keys start with `prefix` (arrays skipped), read
    without the tensors: validation asks a GGUF for its chat template before anything is converted,
    and gguf's own reader indexes every tensor first (seconds)."""
    import mmap
    import struct

    with open(gguf, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file")
        (version,) = struct.unpack_from("<I", data, 4)
        if version < 2:
            raise ValueError(f"{gguf}: GGUF version {version} predates the 64-bit header this reader expects")
        (count,) = struct.unpack_from("<Q", data, 16)
        offset, found = 24, {}

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            return data[at + 8:at + 8 + length].decode("utf-8", errors="replace"), at + 8 + length

        def skip(kind: int, at: int, n: int = 1) -> int:
            if kind in _GGUF_SCALARS:
                return at + n * struct.calcsize("<" + _GGUF_SCALARS[kind])
            if kind == 8:
                for _ in range(n):
                    (length,) = struct.unpack_from("<Q", data, at)
                    at += 8 + length
                return at
            if kind == 9:
                for _ in range(n):
                    inner, items = struct.unpack_from("<IQ", data, at)
                    at = skip(inner, at + 12, items)
                return at
            raise ValueError(f"{gguf}: unknown GGUF metadata type {kind}")

        for _ in range(count):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            if key.startswith(prefix) and kind == 8:
                found[key], offset = string(offset)
            elif key.startswith(prefix) and kind in _GGUF_SCALARS:
                (found[key],) = struct.unpack_from("<" + _GGUF_SCALARS[kind], data, offset)
                offset = skip(kind, offset)
            else:
                offset = skip(kind, offset)
    return found


def gguf_chat_templates(gguf: Path) -> dict[str, str]:
    """The chat templates a GGUF's header carries by name (`tokenizer.chat_template` is the default,
    `tokenizer.chat_template.NAME` a named one): what its tokenizer will carry once converted."""
    key = "tokenizer.chat_template"
    return {("default" if name == key else name.removeprefix(key + ".")): value
            for name, value in gguf_metadata(gguf, key).items() if isinstance(value, str)}
