"""Models loaded once per process: every job of a sweep gets a fresh copy of the pristine model,
so pruning one job never leaks into the next and the load is paid once."""

from __future__ import annotations

import copy

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.models.loaded import LoadedModel
from prunebench.api.model_keys import PLANNING_KEYS

_PRISTINE: dict[str, LoadedModel] = {}


def get_model(model_cfg: DictConfig) -> LoadedModel:
    key = OmegaConf.to_yaml(model_cfg, resolve=True)
    if key not in _PRISTINE:
        _PRISTINE.clear()  # a sweep over models keeps one in memory at a time
        options = OmegaConf.to_container(model_cfg, resolve=True)
        _PRISTINE[key] = instantiate({k: v for k, v in options.items() if k not in PLANNING_KEYS}, _convert_="all")
    return copy.deepcopy(_PRISTINE[key])
