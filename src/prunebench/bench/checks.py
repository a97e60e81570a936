"""A bench config's checks, before any model loads: it builds, its seed is an integer, and it can
time the model's family."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.api.seeds import torch_seed


def check_bench(cfg: DictConfig) -> None:
    if cfg.bench.name == "none":
        return
    options = OmegaConf.to_container(cfg.bench, resolve=True)
    options.pop("semi_structured", None)
    try:
        if "seed" in options:  # its generated prompts and pictures
            torch_seed(f"bench={cfg.bench.name!r}", options["seed"])
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        bench = instantiate(options)
    except Exception as err:
        raise ConfigError(f"bench={cfg.bench.name!r} is misconfigured: {err}") from err
    if cfg.model.family not in bench.families:
        raise ConfigError(f"bench={cfg.bench.name!r} cannot time model={cfg.model.name!r} (family "
                          f"{cfg.model.family!r}); it times: {sorted(bench.families)}")
