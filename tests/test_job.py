"""A whole job through Hydra compose -> prune -> Lightning test loop -> MLflow, on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import MC_FIXTURE, TINY_MC, compose_cfg
from prunebench.job import run
from prunebench.validate import ConfigError


def runs(uri):
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])


def test_dense_then_pruned_job_logs_metrics_tags_artifacts_and_stability(store):
    dense = run(compose_cfg(TINY_MC + ["pruner=none"]), ["pruner=none"])
    pruned = run(compose_cfg(TINY_MC + ["sparsity=0.5"]), ["sparsity=0.5"])
    df = runs(store)
    assert list(df.status) == ["FINISHED", "FINISHED"]
    for metric in ["local_mc/acc", "local_mc/acc_norm", "local_mc/acc_stderr", "sparsity/actual", "avg/score",
                   "params/total", "params/nonzero", "time/eval_s", "stability/local_mc"]:
        assert df[f"metrics.{metric}"].notna().all(), metric
    assert dense["stability/avg"] == 100.0
    assert pruned["sparsity/actual"] == pytest.approx(0.5, abs=1e-3)
    assert pruned["stability/local_mc"] == pytest.approx(100 * pruned["local_mc/acc_norm"] / dense["local_mc/acc_norm"])
    pruned_run = df.iloc[1]
    assert pruned_run["tags.prunebench.pruner"] == "magnitude"
    assert pruned_run["tags.prunebench.sparsity"] == "0.5"
    assert pruned_run["tags.prunebench.model"] == "tiny-llama"
    assert pruned_run["tags.prunebench.task"] == "local_mc"
    assert pruned_run["tags.hydra.overrides"] == "sparsity=0.5"
    assert pruned_run["tags.git.sha"]
    assert json.loads(pruned_run["tags.prunebench.stability_tasks"]) == ["local_mc"]
    assert json.loads(pruned_run["tags.prunebench.stability_excluded"]) == {}
    assert pruned_run["params.pruner.name"] == "magnitude"
    client = MlflowClient(store)
    arts = {a.path for a in client.list_artifacts(pruned_run.run_id)} | {
        a.path for a in client.list_artifacts(pruned_run.run_id, "predictions")}
    assert {"config.yaml", "predictions/local_mc.jsonl"} <= arts
    preds = client.download_artifacts(pruned_run.run_id, "predictions/local_mc.jsonl")
    records = [json.loads(line) for line in open(preds)]
    assert len(records) == 5
    assert sum(r["acc_norm"] for r in records) / 5 == pytest.approx(pruned["local_mc/acc_norm"])


def test_finished_run_key_is_skipped_and_dense_keys_coincide(store):
    assert run(compose_cfg(TINY_MC + ["pruner=none", "sparsity=0.3"])) is not None
    # pruner=none at another sparsity, or sparsity=0 with magnitude, is the same dense job
    assert run(compose_cfg(TINY_MC + ["pruner=none", "sparsity=0.5"])) is None
    assert run(compose_cfg(TINY_MC + ["sparsity=0"])) is None
    assert len(runs(store)) == 1


def test_run_key_holds_only_the_protocol_that_runs():
    from prunebench.tracking.run_key import run_key

    base = ["task=piqa"]
    other = "task.protocols.opencompass.piqa.name=changed"
    assert run_key(compose_cfg(base)) == run_key(compose_cfg(base + [other]))
    opencompass = base + ["task.protocol=opencompass"]
    assert run_key(compose_cfg(opencompass)) != run_key(compose_cfg(opencompass + [other]))
    assert run_key(compose_cfg(opencompass)) != run_key(compose_cfg(base))


def test_bad_config_fails_before_any_run_is_created(store):
    with pytest.raises(ConfigError):
        run(compose_cfg(TINY_MC + ["sparsity=1.5"]))
    mlflow.set_tracking_uri(store)
    exp = mlflow.get_experiment_by_name("prunebench")
    assert exp is None or runs(store).empty


def test_failure_during_the_job_marks_the_run_failed_with_traceback(store):
    with pytest.raises(Exception):
        run(compose_cfg(TINY_MC + ["model.config.num_attention_heads=5"]))  # 64 % 5 != 0: load fails
    df = runs(store)
    assert list(df.status) == ["FAILED"]
    assert "traceback.txt" in {a.path for a in MlflowClient(store).list_artifacts(df.run_id[0])}


@pytest.mark.parametrize("override, message", [("sparsity=1.5", "sparsity=1.5"), ("task=nope", "task/nope"),
                                               # the store fixture's MLFLOW_TRACKING_URI is a SQLite file
                                               ("tracking=server", "tracking=server needs the server's address")])
def test_cli_rejects_bad_values_quickly(store, override, message):
    proc = subprocess.run([sys.executable, "-m", "prunebench", *TINY_MC[:1], override],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    df = runs(store) if mlflow.get_experiment_by_name("prunebench") else None
    assert df is None or "RUNNING" not in set(df.status)


def test_cli_multirun_sweeps_a_grid(store):
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", *TINY_MC, "pruner=none,magnitude",
                           "sparsity=0.3,0.5"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = runs(store)
    df = df[df["tags.prunebench.sweep"].isna()]  # the sweep's parent run is not a job
    # none@0.3 and none@0.5 share the dense run key: 3 runs, all FINISHED
    assert len(df) == 3 and set(df.status) == {"FINISHED"}
    assert sorted(df["tags.prunebench.sparsity"]) == ["0.0", "0.3", "0.5"]


def test_remote_code_stays_off_unless_set_and_is_a_tag_when_set(monkeypatch):
    import transformers

    from prunebench.job import job_tags
    from prunebench.models.hf_causal import load_causal_lm

    seen = []

    class Stop(Exception):
        pass

    def from_pretrained(path, **kwargs):
        seen.append(kwargs["trust_remote_code"])
        raise Stop

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    for overrides in ([], ["model.trust_remote_code=true"]):
        cfg = compose_cfg(["model=hf_causal", "model.path=/models/x", *overrides])
        with pytest.raises(Stop):
            load_causal_lm(**{k: v for k, v in cfg.model.items() if k != "_target_"})
        assert ("prunebench.trust_remote_code" in job_tags(cfg, "k", [])) == bool(overrides)
    assert seen == [False, True]


def test_a_job_that_dies_on_a_later_task_keeps_the_finished_tasks_metrics(store, monkeypatch, tmp_path):
    import prunebench.job as job

    second = tmp_path / "second.jsonl"
    second.write_text(MC_FIXTURE.read_text())
    from omegaconf import OmegaConf, open_dict

    cfg = compose_cfg([*TINY_MC, "pruner=none"])
    with open_dict(cfg):  # a two-task suite: the fixture twice, under two names
        cfg.task.tasks.second = OmegaConf.merge(cfg.task.tasks.local_mc, {"name": "second", "source": {"path": str(second)}})
    evaluate = job.evaluate_task

    def dies_on_second(cfg, loaded, name, task):
        if name == "second":
            raise RuntimeError("the node went away")
        return evaluate(cfg, loaded, name, task)

    monkeypatch.setattr(job, "evaluate_task", dies_on_second)
    with pytest.raises(RuntimeError, match="node went away"):
        run(cfg)
    failed = runs(store).iloc[0]
    assert failed.status == "FAILED"
    assert failed["metrics.local_mc/acc_norm"] >= 0 and "metrics.second/acc_norm" not in failed
