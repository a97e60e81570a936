"""Entry points. The Hydra app is thin: compose, then hand the config to job.run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
log = logging.getLogger("prunebench")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    from prunebench.job import run
    from prunebench.validate import ConfigError

    overrides = list(HydraConfig.get().overrides.task)
    try:
        run(cfg, overrides)
    except ConfigError as err:
        log.error("invalid config: %s", err)
        raise


def main() -> None:
    app()
