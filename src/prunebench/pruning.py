"""A model loaded and pruned as the config says: load -> score (from the score cache where it has
them) -> apply. The one path both a job and `prunebench-export` take, so an export rebuilds the
model its run evaluated."""

from __future__ import annotations

import logging
import time

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.calibration import calibration_config
from prunebench.models.cache import get_model
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner
from prunebench.pruners.score_cache import cached_scores
from prunebench.tracking.run_key import identity

log = logging.getLogger(__name__)


def score_identity(cfg: DictConfig, calibrated: bool) -> dict:
    """What a pruner's scores depend on: the jobs of a sweep over ratios share them. The scorer is
    its class's module and qualified name, however `_target_` spells it (a package's re-export), so
    two packages' pruners of one config name never share scores and one class never misses its own;
    a built-in `_target_` already is that name, so its keys are what they were. The options the
    class names `unscored` (OWL's base and lambda) are left out."""
    pruner = OmegaConf.to_container(cfg.pruner, resolve=True)
    scorer = get_class(pruner["_target_"])
    pruner = {key: value for key, value in pruner.items() if key not in scorer.unscored}
    pruner["_target_"] = f"{scorer.__module__}.{scorer.__qualname__}"
    return {"model": identity(cfg)["model"], "pruner": pruner,
            "calib": OmegaConf.to_container(calibration_config(cfg), resolve=True) if calibrated else None}


def prune(cfg: DictConfig, dense: bool, writer=None) -> tuple[LoadedModel, Pruner, dict[str, float | str], dict | None]:
    """The model loaded and pruned as `cfg` says. Returns the model, the pruner, what pruning
    reported (numbers: metrics; words: tags, the score cache's state among them) and what the
    export `writer` (export/writer.Writer) takes of the model before pruning (None: no writer)."""
    loaded = get_model(cfg.model)
    pruner = instantiate(cfg.pruner, _convert_="all")
    before = writer.before_pruning(loaded.model) if writer is not None else None
    start = time.perf_counter()
    scores, stats = None, {}
    if not dense:
        calib = instantiate(calibration_config(cfg), _convert_="all") if pruner.needs_calibration else None
        scores, hit = cached_scores(pruner, loaded, calib, score_identity(cfg, calib is not None))
        stats["prunebench.score_cache"] = "off" if not pruner.cacheable else "hit" if hit else "miss"
    stats["time/score_s"] = time.perf_counter() - start
    start = time.perf_counter()
    stats.update({} if dense else pruner.apply(loaded, scores, float(cfg.sparsity)))
    stats["time/apply_s"] = time.perf_counter() - start
    stats.setdefault("sparsity/actual", 0.0)
    return loaded, pruner, stats, before


def key_by_removed(cfg: DictConfig) -> None:
    """Where the pruner's unit is coarse (whole experts), two asked sparsities can remove the same
    thing: the job is recorded at what it removes, so its run key, and the sweep's cell, are that
    model's, and a second ratio that removes it again is found FINISHED rather than run twice. Called
    on a validated config, before its run key is taken."""
    from prunebench.models.checks import stated_config
    from prunebench.tracking.run_key import is_dense

    if is_dense(cfg):
        return
    pruner = instantiate(cfg.pruner, _convert_="all")
    keyed = pruner.keyed_sparsity(stated_config(cfg.model, []), float(cfg.sparsity))
    if abs(keyed - float(cfg.sparsity)) > 1e-12:
        log.warning("sparsity=%s removes what sparsity=%g removes on model=%s (%s); recorded and keyed as "
                    "sparsity=%g", cfg.sparsity, keyed, cfg.model.name, pruner.name, keyed)
        with open_dict(cfg):
            cfg.sparsity = keyed
