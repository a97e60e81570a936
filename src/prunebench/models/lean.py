"""Loading a model with no more host memory than the job keeps of it (the issue's peak of 2.2x the
weights): a half-precision checkpoint read at fp32, and a tokenizer's construction copies.

`from_pretrained(path, dtype=float32)` memory-maps a bf16 or fp16 safetensors file (as most causal
LMs ship) and widens every tensor from it; the pages it read stay in the process's resident set until
the whole load ends, so a gemma3-270m fp32 job peaked 0.5 GB (the bf16 file) above the weights it
kept. Here each tensor is widened a slice at a time from the same mapping (safetensors' own
`safe_open`), and the slice's pages are given back (`madvise(MADV_DONTNEED)`, which on a private
mapping of a file that nothing wrote only drops them from this process: a later read faults them in
from the file again). transformers then builds the model around these tensors, without copying
them, and computes its buffers as `from_pretrained(path)` would: the same model, bit for bit
(tests/models/test_lean.py). No library offers this streaming widen, hence the few lines by hand."""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
from contextlib import ExitStack
from pathlib import Path

import torch

NARROW = {"BF16", "F16"}  # safetensors' names of the half-precision floats widened here
SLICE_BYTES = 1 << 24  # widened per step: 16 MB of the file, so the transient stays small


def checkpoint_files(folder: Path) -> list[Path] | None:
    """The safetensors files of a local checkpoint folder, from its shard index when it has one."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def widened_state_dict(files: list[Path], dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """Every tensor of `files` at `dtype` (fp32), or None when one is not a half-precision float (then
    the plain load is as lean, or the checkpoint is one this path does not know)."""
    from safetensors import safe_open

    with ExitStack() as files_open:
        handles = [files_open.enter_context(safe_open(str(path), framework="pt")) for path in files]
        if any(handle.get_slice(key).get_dtype() not in NARROW for handle in handles for key in handle.keys()):
            return None
        return {key: tensor for path, handle in zip(files, handles)
                for key, tensor in widened(path, handle, dtype)}


def widened(path: Path, handle, dtype: torch.dtype):
    """(name, tensor at `dtype`) for each tensor of one open file, in the file's order."""
    release = page_release(path)
    for key in handle.offset_keys():
        view = handle.get_slice(key)
        shape = view.get_shape()
        out = torch.empty(shape, dtype=dtype)
        if not shape:
            out.copy_(handle.get_tensor(key))
        else:
            rows = max(1, SLICE_BYTES // max(1, out[0].numel() * 2))
            for start in range(0, shape[0], rows):
                part = view[start:min(start + rows, shape[0])]
                out[start:start + rows].copy_(part)
                release(part)
        yield key, out


def page_release(path: Path):
    """A function that drops a tensor's whole pages from this process, if they lie in a mapping of
    `path` (checked in /proc/self/maps, so memory that is not the file's is never touched); a no-op
    where that cannot be known (not Linux)."""
    maps = Path("/proc/self/maps")
    if not sys.platform.startswith("linux") or not maps.exists() or not hasattr(mmap, "MADV_DONTNEED"):
        return lambda tensor: None
    target = str(path.resolve())
    ranges = []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((low, high))
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE

    def release(tensor: torch.Tensor) -> None:
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        low, high = -(-start // page) * page, end // page * page
        if high > low and any(a <= low and high <= b for a, b in ranges):
            madvise(low, high - low, mmap.MADV_DONTNEED)

    return release


def load_widened(folder: str, dtype: torch.dtype, **kwargs):
    """The causal LM in local `folder` at `dtype` through `widened_state_dict`, or None where that path
    does not apply (not a local folder of safetensors, weights not half precision, or a model class
    transformers does not register, such as remote code): the caller then loads it plainly."""
    from transformers import AutoConfig, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if dtype != torch.float32:  # only widening to fp32 holds a second copy; decided before any file is read
        return None
    local = Path(folder).expanduser()
    files = checkpoint_files(local) if local.is_dir() else None
    if not files:
        return None
    config = AutoConfig.from_pretrained(local)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    state = widened_state_dict(files, dtype) if model_class is not None else None
    if state is None:
        return None
    model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=dtype, **kwargs)
    model.config._name_or_path = model.name_or_path = folder
    if model.can_generate() and (local / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(local)
    return model


def lean_tokenizer(tokenizer):
    """`tokenizer` without the Python copies of the vocabulary and merges that transformers 5's
    tokenizer classes keep after building their Rust tokenizer from them (`_vocab`, `_merges`):
    0.14 GB for Gemma's 262k tokens and 515k merges, which no method of a causal LM's tokenizer reads
    again (its encoding, decoding and `save_pretrained` use the Rust tokenizer; Whisper's
    `save_vocabulary` is the one reader, and it is no causal LM). Then the freed heap goes back to
    the system, before the weights are read beside it."""
    for name in ("_vocab", "_merges"):
        if isinstance(getattr(tokenizer, name, None), (dict, list)):
            delattr(tokenizer, name)
    release_free_heap()
    return tokenizer


def release_free_heap() -> None:
    """glibc keeps freed heap pages resident for reuse; a model's weights, allocated apart (mmap),
    never reuse them, so they would count in the job's peak for nothing. `malloc_trim` (glibc only;
    a no-op elsewhere) returns them."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:
        return
    trim(0)
