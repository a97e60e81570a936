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


def test_a_job_runs_in_its_experiment_whichever_one_the_caller_made_active(store):
    mlflow.set_experiment("a-notebooks-own")  # MLflow's global state, as a notebook leaves it
    assert run(compose_cfg(TINY_MC + ["pruner=none", "tracking.experiment=elsewhere"])) is not None
    assert [r.info.status for r in MlflowClient(store).search_runs(
        [MlflowClient(store).get_experiment_by_name("elsewhere").experiment_id])] == ["FINISHED"]


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
    assert list(df.status) == ["FAILED", "FAILED"]  # the dense baseline, then the pruned job naming it
    for run_id in df.run_id:
        assert "traceback.txt" in {a.path for a in MlflowClient(store).list_artifacts(run_id)}


@pytest.mark.parametrize("override, message", [("sparsity=1.5", "sparsity=1.5"), ("task=nope", "task/nope"),
                                               # the store fixture's MLFLOW_TRACKING_URI is a SQLite file
                                               ("tracking=server", "tracking=server needs the server's address")])
@pytest.mark.process
def test_cli_rejects_bad_values_quickly(store, override, message):
    proc = subprocess.run([sys.executable, "-m", "prunebench", *TINY_MC[:1], override],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    df = runs(store) if mlflow.get_experiment_by_name("prunebench") else None
    assert df is None or "RUNNING" not in set(df.status)


@pytest.mark.process
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

    from prunebench.tracking.tags import job_tags
    from prunebench.models.hf_causal import load_causal_lm

    seen = []

    class Stop(Exception):
        pass

    def tokenizer(path, **kwargs):  # read first, before the weights: stands in and lets the load go on
        seen.append(("tokenizer", kwargs["trust_remote_code"]))
        return object()

    def from_pretrained(path, **kwargs):
        seen.append(("model", kwargs["trust_remote_code"]))
        raise Stop

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    for overrides in ([], ["model.trust_remote_code=true"]):
        cfg = compose_cfg(["model=hf_causal", "model.path=/models/x", *overrides])
        with pytest.raises(Stop):
            load_causal_lm(**{k: v for k, v in cfg.model.items() if k != "_target_"})
        assert ("prunebench.trust_remote_code" in job_tags(cfg, "k", [])) == bool(overrides)
    assert seen == [("tokenizer", False), ("model", False), ("tokenizer", True), ("model", True)]


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


def test_each_number_says_how_many_documents_and_stability_carries_its_paired_interval(store, tmp_path):
    from prunebench.report.build import write_report

    run(compose_cfg(TINY_MC + ["pruner=none"]))
    run(compose_cfg(TINY_MC + ["pruner=random", "sparsity=0.5"]))
    dense, pruned = (row for _, row in runs(store).iterrows())
    for row in (dense, pruned):
        assert row["metrics.local_mc/n_docs"] == 5
        # a float32 metric is logged as its shortest decimal (0.8), not its float64 expansion
        assert len(repr(row["metrics.local_mc/acc_norm"])) <= 4
    assert dense["metrics.stability/local_mc_ci_low"] == dense["metrics.stability/local_mc_ci_high"] == 100.0
    low, high = pruned["metrics.stability/local_mc_ci_low"], pruned["metrics.stability/local_mc_ci_high"]
    assert low <= pruned["metrics.stability/local_mc"] <= high
    assert (pruned["metrics.stability/avg_ci_low"], pruned["metrics.stability/avg_ci_high"]) == (low, high)
    out = write_report("prunebench", None, tmp_path / "report")
    assert "documents: local_mc 5" in (out / "results.md").read_text()
    assert "0000000" not in (out / "results.csv").read_text()
    # the default plots: standard-error / interval bars, the dense and the chance level
    from prunebench.report import plots
    from prunebench.report.table import load_runs, results_table

    table = results_table(load_runs("prunebench"))
    setting = table.setting.iloc[0]
    chance = (1 / 3 + 1 / 4 + 1 / 2 + 1 / 3 + 1 / 3) / 5  # the fixture's documents have 3, 4, 2, 3 and 3 choices
    for fig in (plots.metric_vs_sparsity(table, ["local_mc/acc_norm"], {(setting, "local_mc"): chance}),
                plots.stability_vs_sparsity(table, {(setting, "local_mc"): chance})):
        ax, = fig.axes
        labels = ax.get_legend_handles_labels()[1]
        assert labels.count("dense") == 1 and labels.count("chance") == 1
        assert ax.containers[0].has_yerr


def test_dense_run_is_keyed_without_a_seed_it_does_not_use(store):
    from prunebench.tracking.run_key import run_key

    assert run(compose_cfg(TINY_MC + ["pruner=none", "seed=0"])) is not None
    assert run(compose_cfg(TINY_MC + ["pruner=none", "seed=1"])) is None  # the same dense work: skipped
    # a pruner that draws from the seed keeps it in its key
    random = [*TINY_MC, "pruner=random", "sparsity=0.5"]
    assert run_key(compose_cfg(random + ["seed=0"])) != run_key(compose_cfg(random + ["seed=1"]))
    # so does a latency protocol whose prompt the seed draws
    timed = [*TINY_MC, "pruner=none", "bench=llm_generate"]
    assert run_key(compose_cfg(timed + ["seed=0"])) != run_key(compose_cfg(timed + ["seed=1"]))


def test_keying_leaves_the_config_as_it_was_its_seed_probed_in_place_or_on_a_copy():
    """The seed probe sets the job's own config's seed for a moment: after the key, the seed, its
    interpolation and the config's flags are as they were, and a read-only config still keys."""
    from omegaconf import OmegaConf

    from prunebench.tracking.run_key import run_key

    cfg = compose_cfg([*TINY_MC, "pruner=random", "sparsity=0.5", "seed=3"])
    before = OmegaConf.to_yaml(cfg)
    key = run_key(cfg)
    assert OmegaConf.to_yaml(cfg) == before and cfg.seed == 3 and OmegaConf.is_struct(cfg)
    OmegaConf.set_readonly(cfg, True)
    assert run_key(cfg) == key and OmegaConf.is_readonly(cfg) and cfg.seed == 3
    written = compose_cfg([*TINY_MC, "pruner=random", "sparsity=0.5", "+base_seed=3", "seed=${base_seed}"])
    assert run_key(written) != key  # another field, base_seed, is in it
    assert OmegaConf.to_container(written)["seed"] == "${base_seed}" and written.seed == 3


def test_a_failing_dense_baseline_fails_once_and_its_pruned_jobs_name_it(store, monkeypatch):
    import prunebench.job as job
    from prunebench.tracking import store as tracking_store

    calls = []
    real = job.execute

    def execute(cfg, tasks, dense, key):
        calls.append(dense)
        if dense:
            raise RuntimeError("dense model exploded")
        return real(cfg, tasks, dense, key)

    monkeypatch.setattr(job, "execute", execute)
    parent = MlflowClient(store).create_run(tracking_store.experiment_id(store, "prunebench"),
                                            tags={"prunebench.sweep": "true"}).info.run_id
    for sparsity in (0.3, 0.5):
        with pytest.raises(job.DenseBaselineFailed, match="dense model exploded"):
            run(compose_cfg(TINY_MC + [f"sparsity={sparsity}"]), [f"sparsity={sparsity}"], parent)
    assert calls == [True]  # the dense model was tried once, no pruned job loaded a model
    df = runs(store)
    children = df[df["tags.mlflow.parentRunId"] == parent]
    assert sorted(zip(children["tags.prunebench.pruner"], children.status)) == [
        ("magnitude", "FAILED"), ("magnitude", "FAILED"), ("none", "FAILED")]
    dense_id = children[children["tags.prunebench.pruner"] == "none"].run_id.iloc[0]
    errors = sorted(children[children["tags.prunebench.pruner"] == "magnitude"]["tags.prunebench.error"])
    assert all("RuntimeError: dense model exploded" in e for e in errors)
    # the first pruned job tried the dense run; the second found it FAILED in this sweep and named it
    assert sum(f"failed earlier in this sweep (run {dense_id})" in e for e in errors) == 1


def test_a_model_named_by_a_folder_shows_the_folder_in_run_names(store, tmp_path):
    from prunebench.api.model_keys import display_name

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)
    assert display_name(str(snapshot)) == "org/tiny"
    assert display_name(str(tmp_path / "models" / "my-llama")) == "my-llama"
    assert display_name("meta-llama/Llama-2-7b-hf") == "meta-llama/Llama-2-7b-hf"  # a hub id as it is
    run(compose_cfg(TINY_MC + ["pruner=none", f"model.name={tmp_path / 'models' / 'my-llama'}"]))
    assert runs(store)["tags.mlflow.runName"].tolist() == ["my-llama|none|0.0|local_mc"]
