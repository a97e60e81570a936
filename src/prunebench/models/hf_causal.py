"""Generic Hugging Face causal LM loader: a hub id or a local folder, with dtype and device."""

from __future__ import annotations

from prunebench.models.loaded import LoadedModel, model_max_length, placed, resolve_dtype
from prunebench.models.lean import lean_tokenizer, load_widened
from prunebench.models.narrow import load_narrowed


def load_causal_lm(*, path: str, name: str, family: str = "causal_lm", dtype: str = "float32",
                   device: str = "cpu", max_length: int | None = None, revision: str | None = None,
                   attn_implementation: str | None = None, trust_remote_code: bool = False,
                   device_map: str | dict | None = None, offload_folder: str | None = None) -> LoadedModel:
    """`trust_remote_code` runs the checkpoint's own Python: off unless the user sets it (a job tag says so).
    `device_map` (accelerate's: "auto" spreads a model too large for one GPU) replaces `device`;
    `offload_folder`: where its `disk` entries' weights go once edited (models/offload.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": resolve_dtype(dtype), "revision": revision, "trust_remote_code": trust_remote_code}
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    offload = {"offload_folder": offload_folder} if offload_folder else {}

    def read():
        # an export whose layers keep widths of their own is narrowed before its weights load (models/narrow.py);
        # a local half-precision checkpoint read at fp32 is widened a slice at a time (models/lean.py)
        model = (load_narrowed(path, kwargs["dtype"], device_map, **extra)
                 or (None if device_map or trust_remote_code or revision else load_widened(path, kwargs["dtype"], **extra))
                 or AutoModelForCausalLM.from_pretrained(path, device_map=device_map, **kwargs, **extra, **offload))
        return placed(model, device, device_map)

    # the tokenizer first: what its loading leaves freed is returned before the weights arrive
    tokenizer = lean_tokenizer(AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code))
    model = read()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, family=family,
                       max_length=model_max_length(model.config, tokenizer, max_length), reload=read)
