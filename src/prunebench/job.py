"""One job: validate -> (skip?) -> load -> score -> prune -> evaluate -> (export) -> log. Thin on purpose:
each step lives in the module named for it. Lightning loads only once the job is valid and not skipped
(`load_libraries`): an invalid or finished job answers without paying for it."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import huggingface_hub.utils
import mlflow
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench import collector
from prunebench.api.metrics import readable
from prunebench.api.model_keys import display_name, run_dtype
from prunebench.bench import memory
from prunebench.cache import cache_dir, content_key
from prunebench.evaluation.registry import evaluation
from prunebench.inputs import data_names, job_inputs, log_inputs
from prunebench.models.cache import get_model
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.base import Pruner
from prunebench.tracking import claim, server, store
from prunebench.pruners.score_cache import cached_scores
from prunebench.recovery import ADAPTER
from prunebench.tracking.run_key import dense_config, dense_key, identity, is_dense, recovering, run_key
from prunebench.tracking.stability import paired_bootstrap, stability
from prunebench.tracking.sweep import record_cell
from prunebench.validate import ConfigError, calibration_config, recovery_data, validate

log = logging.getLogger(__name__)


def flatten(data, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


def job_tags(cfg: DictConfig, key: str, overrides: list[str]) -> dict[str, str]:
    dense = is_dense(cfg)
    return {store.KEY_TAG: key, "prunebench.model": cfg.model.name,
            "prunebench.pruner": "none" if dense else cfg.pruner.name,
            "prunebench.task": cfg.task.name, "prunebench.sparsity": str(0.0 if dense else float(cfg.sparsity)),
            "git.sha": store.git_sha(), "hydra.overrides": " ".join(overrides),
            # whose prompts and scoring ran (task.protocol: lm_eval, opencompass)
            **({"prunebench.protocol": cfg.task.protocol} if cfg.task.get("protocol") else {}),
            **({"prunebench.dtype": run_dtype(cfg.model)} if cfg.model.get("dtype") else {}),
            **({"prunebench.recovery": cfg.recovery.name} if recovering(cfg) and not dense else {}),
            # a checkpoint's own code ran: worth seeing beside its numbers
            **({"prunebench.trust_remote_code": "true"} if cfg.model.get("trust_remote_code") else {})}


def quiet_libraries() -> None:
    """Leaves the libraries' deprecations and progress bars to them. Called when the Hydra job starts
    (every launcher's `run_job` has just configured the job's logging) and again once Lightning is
    loaded (`load_libraries`), which turns its deprecation warnings on when it is imported."""
    # their per-file "Loading weights" / "Map" bars would stand between our per-task bars; transformers
    # and datasets read their switches when first imported, which a job that never runs does not pay
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    else:
        huggingface_hub.utils.disable_progress_bars()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # torch telling Lightning about its own API (LeafSpec), not anything a user set
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(lightning|torch)\.")
    # on a machine with SLURM installed, Lightning suggests srun for every Trainer; jobs here are one process
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")


def load_libraries() -> None:
    """Lightning (torchmetrics, torchvision, scipy and matplotlib with it) and transformers, 2-3 s of
    imports, once a job is known to run. Lightning sets its logger to INFO when it is imported, after
    Hydra configured the job's logging: inside a Hydra job that configuration (with hydra.verbose) is
    then applied again, only by the job that imported them: not by a sweep's later jobs, which Hydra's
    own configuration finds with Lightning loaded (some 0.03 s a time: `logging.config` clears every
    logger's cache for each logger it sets)."""
    imported = len(sys.modules)
    with collector.importing():
        skip_gpu_compiler()
        import lightning.pytorch  # noqa: F401
        import transformers  # noqa: F401

    if HydraConfig.initialized() and len(sys.modules) > imported:
        hydra_cfg = HydraConfig.get()
        configure_log(hydra_cfg.job_logging, hydra_cfg.verbose)
        quiet_libraries()


def skip_gpu_compiler() -> None:
    """Triton compiles GPU kernels and nothing else, yet torch._dynamo (which Lightning imports)
    imports it whenever it is installed, as torch's wheel has it installed: on a host with no GPU that
    is 70 MB of a job's resident memory and 0.1-0.3 s of start-up for nothing. There it is marked
    absent, the way Python spells a module that cannot be imported, so torch takes its own no-Triton
    path (its CPU compiler needs none); a host with a GPU, or a process that imported it already,
    keeps it."""
    import torch

    if not (torch.cuda.is_available() or torch.xpu.is_available()) and sys.modules.setdefault("triton", None) is None:
        # torch's FLOP counter (which Lightning imports) would say so in every job's log
        logging.getLogger("torch.utils.flop_counter").addFilter(no_triton_notice)


def no_triton_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("triton not found")


def evaluate_task(cfg: DictConfig, loaded, name: str, task) -> tuple[dict[str, float], list[dict]]:
    from prunebench.evaluation.progress import DocumentProgress

    data, module = evaluation(task, loaded, cfg.get("limit"), cfg.eval)
    # Lightning's own bar counts batches; ours counts documents, shown where Lightning's would be
    progress = [DocumentProgress(name)] if cfg.trainer.get("enable_progress_bar", True) else []
    trainer = instantiate(cfg.trainer, enable_progress_bar=False, callbacks=progress)
    results = trainer.test(module, datamodule=data, verbose=False)[0]
    metrics = {key: readable(float(value)) for key, value in results.items()}
    truncated = getattr(data, "truncated", None)  # counted by the engines that cut prompts (loglikelihood, generation)
    if truncated is not None:
        metrics[f"{name}/n_truncated"] = float(truncated)
        if truncated:
            log.warning("task %s: %d of %d documents were cut from the left to fit the model's %d positions "
                        "(their start unread; metric %s/n_truncated)", name, truncated, len(module.records),
                        loaded.max_length, name)
    for metric in task.metrics:
        metrics[f"{name}/{metric}_stderr"] = module.stderr(metric)
    return metrics, module.records


def run(cfg: DictConfig, overrides: list[str] = (), parent_run_id: str | None = None) -> dict[str, float] | None:
    try:
        tasks = validate(cfg)
    except ConfigError as err:
        if parent_run_id:
            record_invalid(cfg, overrides, parent_run_id, err)
        raise
    inputs = job_inputs(cfg, tasks)
    key = run_key(cfg, inputs)
    server.export_http_settings(cfg.tracking)
    uri = store.tracking_uri(cfg.tracking.uri)
    exp_id = store.experiment_id(uri, cfg.tracking.experiment)
    dense = is_dense(cfg)
    baseline_key = None if dense else dense_key(cfg, inputs)
    baseline = None if dense else store.finished_run(uri, exp_id, baseline_key)
    if baseline is not None and parent_run_id:  # the sweep's report shows the baseline its cells compare with
        record_cell(uri, parent_run_id, baseline)
    if cfg.tracking.skip_existing:
        done = store.finished_run(uri, exp_id, key)
        if done:
            log.info("skipping: run %s already FINISHED for run key %s", done.info.run_id, key)
            if cfg.get("export"):
                log.warning("export=true: run %s is FINISHED and was not run again; take its model with "
                            "prunebench-export %s (docs/export.md)", done.info.run_id, done.info.run_id)
            if parent_run_id:
                record_cell(uri, parent_run_id, done)
            return None
    load_libraries()
    dense_failure = None
    if not dense and cfg.tracking.ensure_dense and baseline is None:
        dense_failure = ensure_dense(cfg, overrides, parent_run_id, uri, exp_id, baseline_key)
    run_name = (f"{display_name(cfg.model.name)}|{'none' if dense else cfg.pruner.name}|"
                f"{0.0 if dense else cfg.sparsity}|{cfg.task.name}")
    tags = job_tags(cfg, key, list(overrides))
    if inputs:  # which data ran, short enough for a report row (the full digests are the run's dataset inputs)
        tags["prunebench.inputs"] = content_key(inputs)[:12]
        # the same, file by file in words: what a report heads a table with (`data=arc/ARC-Easy-Test.jsonl@ab12`)
        tags.update({f"prunebench.{key}": value for key, value in data_names(inputs, cfg.get("data_dir")).items()})
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    held = claim.acquire(uri, exp_id, key, run_name, tags, cfg.tracking.claim, cfg.tracking.skip_existing)
    if held is None:
        log.info("skipping: another worker FINISHED run key %s while this job waited for it", key)
        done = store.finished_run(uri, exp_id, key)
        if parent_run_id and done:
            record_cell(uri, parent_run_id, done)
        return None
    start = time.perf_counter()
    with store.job_run(held, run_name) as active:
        if dense_failure:  # recorded FAILED like any job, naming why, before any model loads
            raise DenseBaselineFailed(dense_failure)
        params = OmegaConf.to_container(cfg, resolve=True)
        if not recovering(cfg) or dense:  # recovery=none's options are lora's, unused: not this run's settings
            params.pop("recovery", None)
        mlflow.log_params(flatten(params))
        mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        log_inputs(inputs)
        metrics, logged, documents = execute(cfg, tasks, dense, key)
        withheld = withheld_tasks(tasks, metrics)
        # a split without answers (a submission) has no metric, so no place in the average; nor has a
        # task whose number is withheld (a judge that failed too often)
        scored = {name: task for name, task in tasks.items() if task.metrics and name not in withheld}
        primary = {name: metrics[f"{name}/{task.primary}"] for name, task in scored.items()}
        mlflow.set_tag("prunebench.avg_metrics", json.dumps({n: t.primary for n, t in scored.items()}))
        # a perplexity and an accuracy have no mean: where both ran, the average is the accuracies'
        averaged = [n for n in primary if not scored[n].lower_is_better] or list(primary)
        if averaged:
            metrics["avg/score"] = sum(primary[n] for n in averaged) / len(averaged)
            errors = [metrics.get(f"{n}/{scored[n].primary}_stderr", math.nan) for n in averaged]
            if not any(math.isnan(e) for e in errors):  # the tasks' documents are independent samples
                metrics["avg/score_stderr"] = math.sqrt(sum(e * e for e in errors)) / len(errors)
            if len(averaged) < len(primary):
                mlflow.set_tag("prunebench.avg_tasks", json.dumps(averaged))
        lower = frozenset(n for n, t in scored.items() if t.lower_is_better)
        dense_primary = primary
        if not dense:
            dense_run = store.finished_run(uri, exp_id, baseline_key)  # again: ensure_dense may have just made it
            # a dense number withheld is no baseline either
            dense_withheld = json.loads(dense_run.data.tags.get(store.WITHHELD_TAG) or "{}") if dense_run else {}
            dense_primary = dense_run and {n: None if n in dense_withheld else dense_run.data.metrics.get(f"{n}/{t.primary}")
                                           for n, t in scored.items()}
            if dense_run is None:
                log.warning("no FINISHED dense run for key %s yet: stability not logged", baseline_key)
        if dense_primary:
            values, excluded = stability(primary, dense_primary, lower)
            metrics.update(values)
            dense_documents = documents if dense else {
                name: per_document(read_records(dense_run.info.run_id, name), scored[name]) for name in primary}
            metrics.update(paired_bootstrap(
                {n: values for n, (_, values) in documents.items()},
                {n: values for n, (_, values) in dense_documents.items()},
                [n for n in primary if n not in excluded], lower,
                {n: statistic for n, (statistic, _) in documents.items()}))
            # which tasks the stability average is over, and why any other task has no stability
            mlflow.set_tags({"prunebench.stability_tasks": json.dumps([n for n in primary if n not in excluded]),
                             "prunebench.stability_excluded": json.dumps(excluded)})
        mlflow.log_metrics({k: v for k, v in metrics.items() if k not in logged})
    log.info("FINISHED %s in %.0f s: %s (run %s in %s)", run_name, time.perf_counter() - start,
             summary(metrics, tasks, withheld), active.info.run_id, uri)
    return metrics


def withheld_tasks(tasks: dict, metrics: dict[str, float]) -> dict[str, str]:
    """{task: why it has no headline number} for the tasks that say so (a judged task whose judge
    failed on more than judge.max_failure_rate of its gradings), recorded in the run's
    `prunebench.withheld` tag for the reports to name. Its metrics stay logged, for inspection."""
    withheld = {name: reason for name, task in tasks.items()
                if hasattr(task, "withheld") and (reason := task.withheld(metrics))}
    for name, reason in withheld.items():
        log.warning("task %s gets no headline number: %s", name, reason)
    if withheld:
        mlflow.set_tag(store.WITHHELD_TAG, json.dumps(withheld))
    return withheld


class DenseBaselineFailed(RuntimeError):
    """A pruned job's dense baseline failed: its stability has nothing to compare with."""


def ensure_dense(cfg: DictConfig, overrides, parent_run_id: str | None, uri: str, exp_id: str, key: str) -> str | None:
    """Evaluates the missing dense baseline first (tracking.ensure_dense=true), once per sweep: when
    it already failed in this sweep it is not tried again by every pruned job (each would fail the
    same way, and a judge sweep made two FAILED dense runs and no pruned one). Returns why the
    baseline is missing, for the pruned job to fail with; None when it finished."""
    failed = store.failed_run(uri, exp_id, key, parent_run_id) if parent_run_id else None
    if failed is not None:
        return (f"its dense baseline failed earlier in this sweep (run {failed.info.run_id}): "
                f"{failed.data.tags.get('prunebench.error', 'no error recorded')}")
    log.info("no dense baseline for this job yet: evaluating it first (tracking.ensure_dense=true)")
    try:
        run(dense_config(cfg), [*overrides, "(dense baseline)"], parent_run_id)
    except Exception as err:  # recorded FAILED in the store by the dense job itself
        return f"its dense baseline failed: {type(err).__name__}: {err}"
    return None


def per_document(records: list[dict], task) -> tuple[str, dict]:
    """(how a resample of documents becomes the task's number, a name in stability.STATISTICS;
    {doc_id: the document's value of the primary metric}). A task whose number is not a mean of
    per-document values says how its documents combine (`document_values`: perplexity pools its
    windows' NLL and tokens); a corpus-level metric no document has a value of (MCC) gives {}."""
    if hasattr(task, "document_values"):
        return task.document_values(records)
    metric = task.primary
    if not records or not isinstance(records[0].get(metric), (int, float)):
        return "mean", {}
    return "mean", {r.get("doc_id", i): float(r[metric]) for i, r in enumerate(records)}


def read_records(run_id: str, task: str) -> list[dict]:
    """A run's `predictions/<task>.jsonl`, read as the reports read it; [] when it has none (a run
    older than the artifact)."""
    from mlflow.exceptions import MlflowException

    from prunebench.report.predictions import read_predictions

    try:
        return read_predictions(run_id, task)
    except (MlflowException, OSError):
        return []


def record_invalid(cfg: DictConfig, overrides, parent_run_id: str, err: ConfigError) -> None:
    """A sweep's job refused by validation still counts: a FAILED run under the sweep's parent,
    carrying the message, so the parent's jobs_failed and the UI show it. Nothing loaded, nothing
    else logged; a store that cannot be reached leaves the console's message as the record."""
    from mlflow.tracking import MlflowClient

    try:
        uri = store.tracking_uri(cfg.tracking.uri)
        client = MlflowClient(uri)
        names = [str(OmegaConf.select(cfg, f"{group}.name", default="?")) for group in ("model", "pruner", "task")]
        created = client.create_run(store.experiment_id(uri, cfg.tracking.experiment), run_name="|".join(names) + " (invalid)",
                                    tags={"mlflow.parentRunId": parent_run_id, "hydra.overrides": " ".join(overrides),
                                          "prunebench.error": f"ConfigError: {err}"[:5000]})
        client.set_terminated(created.info.run_id, "FAILED")
    except Exception:  # the config error is what the user must see, not a second one about the store
        log.exception("could not record the invalid job in the store")


def summary(metrics: dict[str, float], tasks: dict, withheld: dict[str, str]) -> str:
    """The numbers a sweep's reader scans for: each task's primary metric (the first few; `withheld`
    for one with no headline number), then the averages and what the pruning achieved."""
    keys = {f"{name}/{task.primary}": name for name, task in tasks.items() if task.metrics}
    shown = [f"{key}=withheld" if name in withheld else f"{key}={metrics[key]:.4g}" for key, name in list(keys.items())[:4]]
    if len(keys) > 4:
        shown.append(f"... {len(keys) - 4} more")
    shown += [f"{key}={metrics[key]:.4g}" for key in ("avg/score", "stability/avg", "sparsity/actual") if key in metrics]
    return " ".join(shown)


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


def prune(cfg: DictConfig, dense: bool, exporting: bool = False
          ) -> tuple[LoadedModel, Pruner, dict[str, float | str], dict | None]:
    """The model loaded and pruned as `cfg` says, scores from the score cache where it has them:
    what a job evaluates and `prunebench-export` rebuilds. Returns the model, the pruner, what
    pruning reported (numbers: metrics; words: tags, the score cache's state among them) and, when
    `exporting`, the model's widths before pruning (models/export.widths, for pruning.json)."""
    from prunebench.models.export import mark_layers, widths

    loaded = get_model(cfg.model)
    pruner = instantiate(cfg.pruner, _convert_="all")
    before = widths(loaded.model) if exporting else None
    if exporting:
        mark_layers(loaded.model)
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


def recovery_folder(key: str) -> Path:
    """A recovered run's working folder, keyed by its run key, in the prunebench cache: the LoRA
    adapter as trained (for the export) lives there until the job ends."""
    return cache_dir("recovery", key)


def recover_model(cfg: DictConfig, loaded: LoadedModel, folder: Path) -> dict[str, float]:
    """The pruned model fine-tuned as `recovery` says (recovery/train.py), in place: what is
    evaluated and exported is the recovered model. Distillation's teacher is the dense model read
    again as the job read it (models/cache.py: from its files, or a copy of the one built from a
    config). `recovery/nonzero_delta`: nonzero weights after minus before, 0 when the pruning's
    zeros were kept, so `sparsity/actual` still describes the evaluated model."""
    from prunebench.models.introspection import count_parameters
    from prunebench.recovery.train import recover

    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    teacher = get_model(cfg.model).model.requires_grad_(False) if options["objective"] == "distill" else None
    nonzero = count_parameters(loaded.model, nonzero=True)
    metrics, _ = recover(loaded, options, recovery_data(cfg), cfg.trainer, teacher, folder)
    metrics["recovery/nonzero_delta"] = float(count_parameters(loaded.model, nonzero=True) - nonzero)
    return metrics


def execute(cfg: DictConfig, tasks: dict, dense: bool, key: str) -> tuple[dict[str, float], set[str], dict[str, dict]]:
    """The expensive part, reached only with a valid config and no finished run (`key`: its run
    key). Returns the metrics, the names already logged (each task's, as soon as it finished) and
    each task's per-document values of its primary metric (`per_document`), for stability's interval."""
    from prunebench.models.introspection import count_parameters

    memory.reset_peaks()
    loaded, pruner, stats, before = prune(cfg, dense, bool(cfg.get("export")))
    logged: set[str] = set()
    documents: dict[str, dict] = {}
    # what a pruner reports in words (MoP's L/G sequence) is a tag, not a metric
    mlflow.set_tags({key: value for key, value in stats.items() if isinstance(value, str)})
    metrics = {key: value for key, value in stats.items() if not isinstance(value, str)}
    recovered = recovering(cfg) and not dense
    folder = recovery_folder(key) if recovered else None
    if recovered:
        metrics.update(recover_model(cfg, loaded, folder))
    metrics["params/total"] = float(count_parameters(loaded.model))
    metrics["params/nonzero"] = float(count_parameters(loaded.model, nonzero=True))
    start = time.perf_counter()
    for name, task in tasks.items():
        pruner.start_task(name)
        # the judge and its prompt version, for a judged task: its numbers compare only under one judge
        mlflow.set_tags(getattr(task, "tags", {}))
        task_metrics, records = evaluate_task(cfg, loaded, name, task)
        task_metrics.update(pruner.task_metrics(name))
        task_metrics[f"{name}/n_docs"] = float(len(records))  # how many documents its numbers rest on
        if task.metrics:
            documents[name] = per_document(records, task)
        mlflow.log_metrics(task_metrics)  # now, so a job that dies on a later task keeps this one's
        metrics.update(task_metrics)
        logged.update(task_metrics)
        for path, artifact in pruner.task_artifacts(name).items():
            (mlflow.log_dict if isinstance(artifact, dict) else mlflow.log_figure)(artifact, path)
        mlflow.log_text("\n".join(json.dumps(r) for r in records), f"predictions/{name}.jsonl")
        # what a task writes besides its predictions (a submission file, a judge's reviews)
        for path, artifact in (task.artifacts(records) if hasattr(task, "artifacts") else {}).items():
            (mlflow.log_text if isinstance(artifact, str) else mlflow.log_dict)(artifact, path)
    metrics["time/eval_s"] = time.perf_counter() - start
    if before is not None:  # export=true; before the benchmark, which may swap weights for sparse kernels' formats
        from prunebench.export import export_model

        start = time.perf_counter()
        adapter = folder / ADAPTER if folder is not None and (folder / ADAPTER).is_dir() else None
        export_model(cfg, loaded, stats, before, mlflow.active_run().info.run_id, adapter)
        metrics["time/export_s"] = time.perf_counter() - start
    if cfg.bench.name != "none":
        from prunebench.bench.measure import benchmark

        routed = [metrics[f"{name}/experts_per_token"] for name in tasks if f"{name}/experts_per_token" in metrics]
        bench_metrics, bench_tags = benchmark(cfg, loaded, dense, sum(routed) / len(routed) if routed else None)
        metrics.update(bench_metrics)
        mlflow.set_tags(bench_tags)
    metrics.update(memory.peaks())
    if folder is not None:  # the job is done with it; a job that failed keeps it to resume from
        shutil.rmtree(folder, ignore_errors=True)
    return metrics, logged, documents
