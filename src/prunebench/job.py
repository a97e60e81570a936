"""One job: validate -> key -> (skip?) -> load -> score -> apply -> (recover) -> evaluate -> (export)
-> (bench) -> log. Thin on purpose: each step lives in the module named for it (README, Architecture).
Lightning loads only once the job is valid and not skipped (`startup.load_libraries`): an invalid or
finished job answers without paying for it."""

from __future__ import annotations

import json
import logging
import shutil
import time

import mlflow
from omegaconf import DictConfig, OmegaConf

from prunebench.api.model_keys import display_name
from prunebench.baseline import against_dense, per_document
from prunebench.bench import memory
from prunebench.cache import content_key
from prunebench.evaluation.evaluate import evaluate_task
from prunebench.export.writer import export_writer
from prunebench.inputs import data_names, job_inputs, log_inputs
from prunebench.models.introspection import count_parameters
from prunebench.pruning import key_by_removed, prune
from prunebench.recovery import ADAPTER
from prunebench.recovery.run import recover_model, recovery_folder
from prunebench.startup import load_libraries
from prunebench.tracking import claim, server, store
from prunebench.tracking.run_key import dense_config, dense_key, is_dense, recovering, run_key
from prunebench.tracking.headline import average, summary, withheld_tasks
from prunebench.tracking.sweep import record_cell
from prunebench.tracking.tags import flatten, job_tags
from prunebench.validate import ConfigError, validate

log = logging.getLogger(__name__)


class DenseBaselineFailed(RuntimeError):
    """A pruned job's dense baseline failed: its stability has nothing to compare with."""


def run(cfg: DictConfig, overrides: list[str] = (), parent_run_id: str | None = None) -> dict[str, float] | None:
    try:
        tasks = validate(cfg, overrides=overrides)
        key_by_removed(cfg)
    except ConfigError as err:
        if parent_run_id:
            store.record_invalid(cfg, overrides, parent_run_id, err)
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
    if cfg.tracking.skip_existing and (done := store.finished_run(uri, exp_id, key)):
        log.info("skipping: run %s already FINISHED for run key %s", done.info.run_id, key)
        if (export := cfg.export.name) != "none":
            exported = done.data.tags.get("prunebench.export")
            if exported:
                log.warning("export=%s: run %s is FINISHED and was not run again; its model was exported when it "
                            "ran: %s", export, done.info.run_id, exported)
            elif recovering(cfg) and not dense:  # prunebench-export cannot repeat a recovery's training
                log.warning("export=%s: run %s is FINISHED and was not run again, without an export; its recovered "
                            "model is written only by running it again: tracking.skip_existing=false export=%s",
                            export, done.info.run_id, export)
            else:
                log.warning("export=%s: run %s is FINISHED and was not run again; take its model with "
                            "prunebench-export %s (docs/export.md)", export, done.info.run_id, done.info.run_id)
        if parent_run_id:
            record_cell(uri, parent_run_id, done)
        return None
    load_libraries()
    dense_failure = None
    if not dense and cfg.tracking.ensure_dense and baseline is None:
        dense_failure = ensure_dense(cfg, overrides, parent_run_id, uri, exp_id, baseline_key)
    run_name = f"{display_name(cfg.model.name)}|{'none' if dense else cfg.pruner.name}|{0.0 if dense else cfg.sparsity}|{cfg.task.name}"
    tags = job_tags(cfg, key, list(overrides))
    if inputs:  # which data ran, short enough for a report row (the full digests are the run's dataset inputs)
        tags["prunebench.inputs"] = content_key(inputs)[:12]
        # the same, file by file in words: what a report heads a table with (`data=arc/ARC-Easy-Test.jsonl@ab12`)
        tags.update({f"prunebench.{name}": value for name, value in data_names(inputs, cfg.get("data_dir")).items()})
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    held = claim.acquire(uri, exp_id, key, run_name, tags, cfg.tracking.claim, cfg.tracking.skip_existing)
    if held is None:
        log.info("skipping: another worker FINISHED run key %s while this job waited for it", key)
        if parent_run_id and (done := store.finished_run(uri, exp_id, key)):
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
        averages, averaged = average(primary, scored, metrics)
        metrics.update(averages)
        if len(averaged) < len(primary):
            mlflow.set_tag("prunebench.avg_tasks", json.dumps(averaged))
        # again, not `baseline`: ensure_dense may have just made it
        dense_run = None if dense else store.finished_run(uri, exp_id, baseline_key)
        if dense or dense_run is not None:
            metrics.update(against_dense(primary, scored, documents, dense_run))
        else:
            log.warning("no FINISHED dense run for key %s yet: stability not logged", baseline_key)
        mlflow.log_metrics({k: v for k, v in metrics.items() if k not in logged})
    log.info("FINISHED %s in %.0f s: %s (run %s in %s)", run_name, time.perf_counter() - start,
             summary(metrics, tasks, withheld), active.info.run_id, uri)
    return metrics


def execute(cfg: DictConfig, tasks: dict, dense: bool, key: str) -> tuple[dict[str, float], set[str], dict[str, dict]]:
    """The expensive part, reached only with a valid config and no finished run (`key`: its run
    key). Returns the metrics, the names already logged (each task's, as soon as it finished) and
    each task's per-document values of its primary metric (`baseline.per_document`), for stability's interval."""
    memory.reset_peaks()
    writer = export_writer(cfg)
    loaded, pruner, stats, before = prune(cfg, dense, writer)
    logged: set[str] = set()
    documents: dict[str, dict] = {}
    # what a pruner reports in words (MoP's L/G sequence) is a tag, not a metric
    mlflow.set_tags({name: value for name, value in stats.items() if isinstance(value, str)})
    metrics = {name: value for name, value in stats.items() if not isinstance(value, str)}
    folder = recovery_folder(key) if recovering(cfg) and not dense else None
    if folder is not None:
        metrics.update(recover_model(cfg, loaded, folder))
    metrics["params/total"] = float(count_parameters(loaded.model))
    metrics["params/nonzero"] = float(count_parameters(loaded.model, nonzero=True))
    start, positions = time.perf_counter(), []
    for name, task in tasks.items():
        pruner.start_task(name)
        # the judge and its prompt version, for a judged task: its numbers compare only under one judge
        mlflow.set_tags(getattr(task, "tags", {}))
        task_metrics, records, work = evaluate_task(cfg, loaded, name, task)
        positions.append(work)
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
    if None not in positions:  # the positions those seconds ran: a plan's measure of the machine's speed (plan.py)
        metrics["time/eval_positions"] = float(sum(positions))
    if writer.writes:  # before the benchmark, which may swap weights for sparse kernels' formats
        from prunebench.export.logged_model import export_model

        start = time.perf_counter()
        adapter = folder / ADAPTER if folder is not None and (folder / ADAPTER).is_dir() else None
        export_model(cfg, writer, loaded, stats, before, mlflow.active_run().info.run_id, adapter)
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
