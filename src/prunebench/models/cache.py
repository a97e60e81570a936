"""Models loaded once per process: every job of a sweep gets a fresh copy of the pristine model,
so pruning one job never leaks into the next and the load is paid once.

The pristine model waits in host memory and only the job's copy goes to `model.device`, so an
accelerator holds one model, the one being pruned, not two (a 7B bf16 model and its copy are 27 GB).
A model placed by `model.device_map` (larger than one GPU) is loaded afresh for each job instead: its
safetensors files are memory-mapped, so the page cache keeps the next load cheap."""

from __future__ import annotations

import copy

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.api.model_keys import PLANNING_KEYS, run_dtype
from prunebench.models.loaded import LoadedModel

_PRISTINE: dict[str, LoadedModel] = {}


def get_model(model_cfg: DictConfig) -> LoadedModel:
    options = {k: v for k, v in OmegaConf.to_container(model_cfg, resolve=True).items() if k not in PLANNING_KEYS}
    if "dtype" in options:
        options["dtype"] = run_dtype(model_cfg)
    if model_cfg.get("device_map"):
        _PRISTINE.clear()
        return instantiate(options, _convert_="all")
    key = OmegaConf.to_yaml(model_cfg, resolve=True)
    if key not in _PRISTINE:
        _PRISTINE.clear()  # a sweep over models keeps one in memory at a time
        _PRISTINE[key] = instantiate({**options, "device": "cpu"}, _convert_="all")
    pristine = _PRISTINE[key]
    # tokenizer and processor are read, never changed, by a job: shared, not copied (a deepcopy of
    # Gemma's 262k-token tokenizer took 1.9 s, of its model 0.2 s)
    shared = {id(pristine.tokenizer): pristine.tokenizer, id(pristine.processor): pristine.processor}
    loaded = copy.deepcopy(pristine, memo=shared)
    loaded.model.to(model_cfg.device)
    return loaded
