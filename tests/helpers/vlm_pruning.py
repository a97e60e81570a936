"""A tiny vision-language model pruned as a job prunes it, and an image input for it."""

from __future__ import annotations

import copy

import numpy as np
from conftest import compose_cfg
from hydra.utils import instantiate
from PIL import Image

from prunebench.validate import validate
from prunebench.calibration import calibration_config


def pruned(base, overrides: list[str], sparsity: float = 0.5):
    """A copy of `base` pruned as a job would prune it (the config validated first)."""
    cfg = compose_cfg(["model=tiny-llava", "task=easy_vqa", f"sparsity={sparsity}", *overrides])
    validate(cfg)
    loaded, pruner = copy.deepcopy(base), instantiate(cfg.pruner, _convert_="all")
    calib = instantiate(calibration_config(cfg), _convert_="all") if pruner.needs_calibration else None
    stats = pruner.apply(loaded, pruner.score(loaded, calib), sparsity)
    return loaded, stats


def image_inputs(model, size=(16, 16)) -> dict:
    picture = Image.fromarray(np.random.RandomState(1).randint(0, 255, (*size, 3), dtype=np.uint8))
    return model.multimodal_inputs([model.chat_prompt("What colour is the shape?", 1)], [[picture]])

