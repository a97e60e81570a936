"""Models loaded once per process where that is cheap: every job of a sweep gets an unpruned model,
so pruning one job never leaks into the next, and the tokenizer and processor are loaded once.

A model read from files (its loader sets `LoadedModel.reload`) is not held pristine beside the job's
copy: the first job takes the model just loaded, each later job reads the weights again, and only
the tokenizer and processor wait here. The pristine copy was a third of a gemma3-270m fp32 job's
peak memory, and reading the weights again costs less than copying them did, as the safetensors
files stay in the page cache. Only
where memory is too short for the page cache to keep them is each load read from disk, and there a
second copy would not have fitted either. A model built from a config (the tiny test models) or by timm has no
reload: it is held here and each job gets a deep copy.

The job's model goes to `model.device` only after loading, so an accelerator holds one model, the
one being pruned. A model placed by `model.device_map` (larger than one GPU) is loaded afresh, with
its tokenizer, for each job."""

from __future__ import annotations

import copy
import gc

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.api.model_keys import PLANNING_KEYS, run_dtype
from prunebench.models.loaded import LoadedModel

# per model config (one at a time): the pristine model, or, for one that reloads from its files, its
# adapter without the weights (`model` None)
_PRISTINE: dict[str, LoadedModel] = {}


def get_model(model_cfg: DictConfig, placement: dict | None = None) -> LoadedModel:
    """`placement`: the loader's `device_map` and `offload_folder` for sequential onloading
    (pruning.onload), loaded afresh as a model placed by model.device_map is."""
    options = {k: v for k, v in OmegaConf.to_container(model_cfg, resolve=True).items() if k not in PLANNING_KEYS}
    if "dtype" in options:
        options["dtype"] = run_dtype(model_cfg)
    if model_cfg.get("device_map") or placement:
        _PRISTINE.clear()
        return instantiate({**options, **(placement or {})}, _convert_="all")
    key = OmegaConf.to_yaml(model_cfg, resolve=True)
    if key not in _PRISTINE:
        _PRISTINE.clear()  # a sweep over models keeps one in memory at a time
        loaded = instantiate({**options, "device": "cpu"}, _convert_="all")
        if loaded.reload is None:
            _PRISTINE[key] = loaded
        else:  # this job takes the model just read; a later one reads it again
            _PRISTINE[key] = _copy(loaded, without_model=True)
            loaded.model.to(model_cfg.device)
            return loaded
    kept = _PRISTINE[key]
    loaded = _copy(kept)
    if loaded.model is None:
        # the last job's model, which reference cycles (Lightning's) hold until the collector runs, goes
        # before this one is read: a full collection (0.3-1 s), paid only for a model read from files
        gc.collect()
        loaded.model = kept.reload()
    loaded.model.to(model_cfg.device)
    return loaded


def _copy(loaded: LoadedModel, without_model: bool = False) -> LoadedModel:
    """A deep copy sharing the tokenizer and processor, which a job reads and never changes (a deepcopy
    of a 262k-token tokenizer costs more than of a small model); `without_model`: None for the model."""
    memo = {id(loaded.tokenizer): loaded.tokenizer, id(loaded.processor): loaded.processor}
    if without_model:
        memo[id(loaded.model)] = None
    return copy.deepcopy(loaded, memo)
