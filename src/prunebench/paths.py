"""Where the Hydra configs are. An installed wheel carries them inside the package (prunebench/conf,
mapped from the top-level conf/ by setup.py); a checkout, installed editable or only on PYTHONPATH,
reads its own conf/ beside src/, so an edited config takes effect without reinstalling."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from prunebench.api.task_keys import joined_names

_PACKAGE = Path(__file__).resolve().parent
CONF_DIR = str(next(path for path in (_PACKAGE / "conf", _PACKAGE.parents[1] / "conf")
                    if (path / "config.yaml").is_file()))

# registered here because every composer of the configs (the CLI, the tests, the plan) imports this module
OmegaConf.register_new_resolver("prunebench_joined_names", joined_names, replace=True)
