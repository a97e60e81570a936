"""A pruned job exported and its folder evaluated again as a dense model: the round trip the export tests of each pruner run."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
from conftest import TINY_MC, compose_cfg

from prunebench.job import run
from prunebench.report.predictions import read_predictions

TASK = TINY_MC[1:]  # the local multiple-choice task, without the model


JOB = ["tracking.ensure_dense=false", "limit=4"]


def last_run():
    return mlflow.search_runs(experiment_names=["prunebench"], output_format="list",
                              order_by=["attributes.start_time DESC"])[0]


def exported_folder(run_, tmp_path: Path) -> Path:
    where = run_.data.tags["prunebench.export"]
    kind, _, target = where.partition(":")
    if kind == "dir":
        return Path(target)
    assert kind == "mlflow-model" and target.startswith("models:/"), where
    return Path(mlflow.artifacts.download_artifacts(target, dst_path=str(tmp_path / run_.info.run_id)))


def reloaded_run(folder: Path, task: list[str], family: str = "causal_lm", model: str = "hf_causal"):
    """The exported folder evaluated as a dense model on `task`: (its metrics, its run)."""
    metrics = run(compose_cfg([f"model={model}", f"model.path={folder}", f"model.family={family}", *task, *JOB,
                               "pruner=none"]))
    return metrics, last_run()


def assert_same(pruned, reloaded, task: str, metrics: tuple[str, ...]) -> None:
    """The same weights, shapes and tokenizer run the same kernels: equal bit for bit at fp32."""
    for key in metrics:
        assert reloaded.data.metrics[f"{task}/{key}"] == pruned.data.metrics[f"{task}/{key}"], key
    def documents(run_):  # a generation task lists documents in its batches' order: by id
        return sorted(read_predictions(run_.info.run_id, task), key=lambda record: record["doc_id"])

    assert documents(reloaded) == documents(pruned)


def round_trip(model: str, overrides: list[str], tmp_path: Path, family: str = "causal_lm"):
    """Runs the pruned job with export=hf, then the export as a dense hf_causal model on the same
    documents; returns (pruned run, reloaded run, the folder, its pruning.json)."""
    run(compose_cfg([f"model={model}", *TASK, *JOB, *overrides, "export=hf"]))
    pruned = last_run()
    folder = exported_folder(pruned, tmp_path)
    _, reloaded = reloaded_run(folder, TASK, family)
    assert_same(pruned, reloaded, "local_mc", ("acc", "acc_norm"))
    return pruned, reloaded, folder, json.loads((folder / "pruning.json").read_text())

