"""Where the Hydra configs are. An installed wheel carries them inside the package (prunebench/conf,
mapped from the top-level conf/ by setup.py); a checkout, installed editable or only on PYTHONPATH,
reads its own conf/ beside src/, so an edited config takes effect without reinstalling."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

_PACKAGE = Path(__file__).resolve().parent
CONF_DIR = str(next(path for path in (_PACKAGE / "conf", _PACKAGE.parents[1] / "conf")
                    if (path / "config.yaml").is_file()))


def lm_eval_names(entries) -> list[str]:
    """The task names a `task.lm_eval` list gives (a name, or a mapping with `task` and maybe `name`)."""
    if entries is None:
        return []
    entries = [entries] if isinstance(entries, str) else entries
    return [str(e) if isinstance(e, str) else str(e.get("name") or e.get("task")) for e in entries]


def joined_names(entries) -> str:
    """A task option's name from the lm-eval tasks it lists (`task=lm_eval task.lm_eval=[boolq,rte]`
    runs as "boolq+rte"): run names and tags then say what ran."""
    return "+".join(lm_eval_names(entries))


def task_names(task_cfg) -> list[str]:
    """Every task a composed `task` option evaluates: its definitions, then its lm-eval entries."""
    return [*(task_cfg.get("tasks") or {}), *lm_eval_names(task_cfg.get("lm_eval"))]


# registered here because every composer of the configs (the CLI, the tests, the plan) imports this module
OmegaConf.register_new_resolver("prunebench_joined_names", joined_names, replace=True)
