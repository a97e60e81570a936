"""Entry points. The Hydra app is thin: compose, then hand the config to job.run."""

from __future__ import annotations

import logging
import os
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from prunebench.paths import CONF_DIR
from prunebench.tracking.sweep import PARENT_ENV

log = logging.getLogger("prunebench")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    from prunebench.job import run
    from prunebench.validate import ConfigError

    overrides = list(HydraConfig.get().overrides.task)
    try:
        run(cfg, overrides, os.environ.get(PARENT_ENV))
    except ConfigError as err:
        log.error("invalid config: %s", err)
        raise
    except Exception as err:
        if cfg.fail_fast:  # Hydra's launcher catches Exception per job; SystemExit stops the sweep
            raise SystemExit(f"prunebench: stopping the sweep (fail_fast=true): {err}") from err
        raise


def main() -> None:
    # SIGTERM (a cluster's scancel, a killed make) unwinds like Ctrl-C: open runs end KILLED
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    app()
