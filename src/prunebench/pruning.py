"""A model loaded and pruned as the config says: load -> score (from the score cache where it has
them) -> apply. The one path both a job and `prunebench-export` take, so an export rebuilds the
model its run evaluated."""

from __future__ import annotations

import inspect
import logging
import tempfile
import time

from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.api.errors import ConfigError
from prunebench.calibration import calibration_config
from prunebench.models.cache import get_model
from prunebench.models.checks import stated_config
from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel, resolve_dtype
from prunebench.models.offload import ONLOAD, Footprint, decide, free_bytes, meta_model, onload_map
from prunebench.pruners.base import Pruner
from prunebench.pruners.score_cache import cached_scores
from prunebench.tracking.run_key import identity, is_dense

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
    pruner = instantiate(cfg.pruner, _convert_="all")
    config = stated_config(cfg.model) if onload_option(cfg) != "none" else None  # read once, for both below
    onload = onloads(cfg, pruner, config)
    loaded = get_model(cfg.model, placement(cfg, onload, config))
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
    if onload_option(cfg) != "none":  # whether it onloaded (`auto` decides per job)
        stats["prunebench.onload"] = "sequential" if onload else "none"
    return loaded, pruner, stats, before


def onload_option(cfg: DictConfig) -> str:
    """pruning.onload (a config from before the option has none: `none`)."""
    return OmegaConf.select(cfg, "pruning.onload", default="none")


def footprint(cfg: DictConfig, config, pruner) -> Footprint:
    """What the job holds in memory, from the shapes of the model `config` describes (built on `meta`,
    no weights read), the calibration's windows and the pruner's per-block statistics."""
    from prunebench.api.model_keys import run_dtype

    calib = calibration_config(cfg) if pruner.needs_calibration and not is_dense(cfg) else {}
    samples, seq_len = int(calib.get("n_samples") or 0), int(calib.get("seq_len") or 0)
    model = meta_model(config)
    return Footprint.of(model, transformer_blocks(model)[1], resolve_dtype(run_dtype(cfg.model)), samples, seq_len,
                        pruner if not is_dense(cfg) else None)


def check_onload(cfg: DictConfig, config, pruner: Pruner) -> None:
    """pruning.onload, before the model loads: a known value, a model read from its checkpoint files
    by from_pretrained, a pruner that works block by block, and a budget one block at a time fits
    (ConfigError naming the numbers). `config`: the checkpoint's config (None: not read yet, a plan's
    hub id, whose budget is checked when the job starts)."""
    onload = onload_option(cfg)
    if onload not in ONLOAD:
        raise ConfigError(f"pruning.onload={onload!r}: use one of {list(ONLOAD)} (sequential: the decoder blocks "
                          f"stay in host memory or on disk and come to model.device one at a time; auto: so when "
                          f"the whole model does not fit)")
    if onload == "none":
        return
    memory = OmegaConf.select(cfg, "pruning.memory_gb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0):
        raise ConfigError(f"pruning.memory_gb={memory!r} must be a positive number of GB, or null ({cfg.model.device}'s "
                          f"free memory when the job starts)")
    if cfg.model.get("device_map"):
        raise ConfigError(f"pruning.onload={onload} places the decoder blocks itself; leave model.device_map=null "
                          f"(or place the model with model.device_map alone and pruning.onload=none)")
    if not reads_checkpoint_files(cfg.model):
        raise ConfigError(f"pruning.onload={onload} reads each decoder block from the checkpoint's files through "
                          f"from_pretrained; model={cfg.model.name!r} is loaded by {cfg.model._target_}, which builds it "
                          f"another way: save it (save_pretrained) and use model=hf_causal model.path=FOLDER")
    if not is_dense(cfg) and pruner.onload_refusal:
        raise ConfigError(f"pruner={cfg.pruner.name!r} cannot prune onloaded (pruning.onload={onload}): "
                          f"{pruner.onload_refusal}; use pruning.onload=none on a device that holds the model")
    if config is not None:
        try:
            onloads(cfg, pruner, config)
        except ValueError as err:
            raise ConfigError(str(err)) from None


def onloads(cfg: DictConfig, pruner: Pruner, config=None) -> bool:
    """Whether this job onloads: `sequential`, or `auto` where the whole job does not fit the budget
    (pruning.memory_gb, else the device's free memory now); ValueError where one block at a time
    does not fit either. `config`: the checkpoint's (read here when not given)."""
    onload = onload_option(cfg)
    if onload == "none":
        return False
    config = stated_config(cfg.model) if config is None else config
    memory = OmegaConf.select(cfg, "pruning.memory_gb")
    budget = int(memory * 1e9) if memory is not None else free_bytes(cfg.model.device)
    return decide(onload, footprint(cfg, config, pruner), budget, str(cfg.model.device))


def reads_checkpoint_files(model_cfg: DictConfig) -> bool:
    """Whether the model's loader is a from_pretrained one, which can leave blocks offloaded (it takes
    `offload_folder`); a tiny or GGUF loader builds its model another way."""
    return "offload_folder" in inspect.signature(get_method(model_cfg._target_)).parameters


def placement(cfg: DictConfig, onload: bool, config=None) -> dict | None:
    """The loader's `offload_folder` for a model accelerate offloads (sequential onloading, or a
    model.device_map with `disk` entries), where edited blocks' weights are written: pruning.offload_folder,
    else a temporary folder removed at the next job; onloading, also its `device_map`, the blocks away
    from model.device (models/offload.onload_map). None: the loader places the model as it always has.
    `config`: the checkpoint's (read here when not given)."""
    if not (onload or cfg.model.get("device_map")) or not reads_checkpoint_files(cfg.model):
        return None
    folder = OmegaConf.select(cfg, "pruning.offload_folder")
    for done in _SCRATCH:  # the last job's, whose model is evaluated and gone
        done.cleanup()
    _SCRATCH.clear()
    if folder is None:
        scratch = tempfile.TemporaryDirectory(prefix="prunebench-onload-")
        _SCRATCH.append(scratch)  # kept while the job runs: every forward reads the pruned blocks there
        folder = scratch.name
    if not onload:
        return {"offload_folder": str(folder)}
    model = meta_model(stated_config(cfg.model) if config is None else config)
    prefix, blocks = transformer_blocks(model)
    return {"device_map": onload_map(model, prefix, len(blocks), str(cfg.model.device)), "offload_folder": str(folder)}


# the temporary offload folder of this process's onloaded model (the running job's)
_SCRATCH: list[tempfile.TemporaryDirectory] = []


def key_by_removed(cfg: DictConfig) -> None:
    """Where the pruner's unit is coarse (whole experts), two asked sparsities can remove the same
    thing: the job is recorded at what it removes, so its run key, and the sweep's cell, are that
    model's, and a second ratio that removes it again is found FINISHED rather than run twice. Called
    on a validated config, before its run key is taken."""
    if is_dense(cfg):
        return
    pruner = instantiate(cfg.pruner, _convert_="all")
    keyed = pruner.keyed_sparsity(stated_config(cfg.model, []), float(cfg.sparsity))
    if abs(keyed - float(cfg.sparsity)) > 1e-12:
        log.warning("sparsity=%s removes what sparsity=%g removes on model=%s (%s); recorded and keyed as "
                    "sparsity=%g", cfg.sparsity, keyed, cfg.model.name, pruner.name, keyed)
        with open_dict(cfg):
            cfg.sparsity = keyed
