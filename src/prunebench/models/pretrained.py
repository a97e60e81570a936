"""What a model config points at, read before any weights: `model.path` as a local checkpoint folder
or as a hub id, and its transformers config (AutoConfig reads config.json alone, milliseconds), so a
missing or empty folder, or a hub id that cannot be had, fails validation instead of the run."""

from __future__ import annotations

import re
from pathlib import Path

from prunebench.hub import unreachable

# the shape of a hub id: `org/name` (a bare `name` is a legacy hub model too, such as gpt2)
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")  # lm-eval HFLM.max_length's order


def checkpoint_config(path: str, revision: str | None = None, trust_remote_code: bool = False,
                      local_only: bool = False):
    """The checkpoint's transformers config; ValueError naming what was looked for (config.json, in
    which folder or hub repository) and whether `path` was taken as a folder or a hub id. The hub is
    asked at most once (`unreachable`); `local_only` (a plan) never asks it, and returns None for a
    hub id whose config.json is not in the Hugging Face cache."""
    from huggingface_hub import constants, try_to_load_from_cache

    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model.path={path!r} is a folder without config.json ({local.resolve()} holds "
                             f"{sorted(p.name for p in local.iterdir())[:8]}); from_pretrained reads config.json first: "
                             f"point model.path at a checkpoint folder (config.json, *.safetensors, tokenizer files) "
                             f"or a hub id (org/name)")
        taken = "a local folder"
    elif local.exists():
        raise ValueError(f"model.path={path!r} is a file; use a checkpoint folder holding config.json, or a hub id (org/name)")
    elif not HUB_ID.match(path):
        raise ValueError(f"model.path={path!r}: no such folder ({local.resolve()}, where config.json was looked for), "
                         f"and not of a hub id's shape (org/name); point it at a checkpoint folder or a hub id")
    else:
        taken = "a hub id (no local folder of that name exists)"
        cached = isinstance(try_to_load_from_cache(path, "config.json", revision=revision), str)
        if constants.HF_HUB_OFFLINE and not cached:
            raise ValueError(f"model.path={path!r} is no local folder, so it was taken as a hub id; its config.json "
                             f"is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 forbids "
                             f"asking the hub: download it where the hub is reachable, or point model.path at a local folder")
        if local_only and not cached:
            return None
        reason = None if local_only or constants.HF_HUB_OFFLINE else unreachable(path, revision)
        if reason and not cached:
            raise ValueError(f"model.path={path!r} is no local folder, so it was taken as a hub id, but the hub "
                             f"({constants.ENDPOINT}) was not reached by one request for its config.json ({reason}; "
                             f"timeout HF_HUB_ETAG_TIMEOUT={constants.HF_HUB_ETAG_TIMEOUT} s) and the Hugging Face "
                             f"cache ({constants.HF_HUB_CACHE}) holds none; without network, download the model where "
                             f"the hub is reachable and set HF_HUB_OFFLINE=1, or point model.path=FOLDER at a local "
                             f"checkpoint folder")
        if reason or local_only:  # the cached copy, without a second request
            return read_config(path, revision, trust_remote_code, taken, local_files_only=True)
    return read_config(path, revision, trust_remote_code, taken)


def read_config(path: str, revision: str | None, trust_remote_code: bool, taken: str, local_files_only: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code,
                                          local_files_only=local_files_only)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"model.path={path!r}, taken as {taken}: its config.json could not be read ({reason})") from None


def position_limit(config) -> int | None:
    """The positions a config says the model reads (a VLM's from its text config), as the loaders'
    `model_max_length` reads them; a dict (a tiny model's config) or a transformers config. None
    when it names none (the loader then asks the tokenizer, which is not read here)."""
    if config is None:
        return None
    return config_positions((config.get("text_config") if isinstance(config, dict)
                             else getattr(config, "text_config", None)) or config)


def config_positions(config) -> int | None:
    """The first of POSITION_KEYS the config (a dict or a transformers config) sets: lm-eval HFLM's
    order, which `models.loaded.model_max_length` follows after the loaded model."""
    for key in POSITION_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if value:
            return int(value)
    return None
