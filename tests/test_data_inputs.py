"""A run's identity includes the data it reads: a task file with one more document is a new run,
and each run names its files and their digests as MLflow dataset inputs."""

from __future__ import annotations

import hashlib
import json
import shutil

from mlflow.tracking import MlflowClient

from conftest import FIXTURES, MC_FIXTURE, compose_cfg
from prunebench.inputs import digest, job_inputs
from prunebench.job import run
from prunebench.tracking.run_key import run_key
from prunebench.validate import validate


def tiny_mc(path) -> list[str]:
    return ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={path}", "pruner=none",
            "limit=2", "trainer.enable_progress_bar=false"]


def test_a_document_appended_to_the_task_file_is_a_new_run_with_its_data_logged(store, tmp_path):
    path = tmp_path / "questions.jsonl"
    shutil.copy(MC_FIXTURE, path)
    assert run(compose_cfg(tiny_mc(path))) is not None
    assert run(compose_cfg(tiny_mc(path))) is None  # same data: skipped as FINISHED
    with path.open("a") as handle:
        handle.write(json.dumps({"question": "Which is a colour?", "choices": ["red", "dog"], "label": 0}) + "\n")
    assert run(compose_cfg(tiny_mc(path))) is not None  # limit=2 reads the same two documents, yet the file changed
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and len({r.data.tags["prunebench.run_key"] for r in runs}) == 2
    newest = runs[-1]
    (logged,) = newest.inputs.dataset_inputs
    assert json.loads(logged.dataset.source)["uri"] == str(path.resolve())
    assert logged.dataset.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:32]
    assert {t.key: t.value for t in logged.tags}["mlflow.data.context"] == "task:local_mc"
    assert newest.data.tags["prunebench.inputs"] != runs[0].data.tags["prunebench.inputs"]


def test_a_job_reading_only_the_hub_keeps_its_key_and_calibration_data_counts_only_when_used(tmp_path):
    cfg = compose_cfg(["model=tiny-llama", "task=bbh_zeroshot", "pruner=none",
                       "model.max_length=512"])  # BBH generates up to 256 tokens: room for a prompt
    assert job_inputs(cfg, validate(cfg, [])) == {}  # validated as a plan does: the hub is not asked
    assert run_key(cfg, {}) == run_key(cfg)
    calib = tmp_path / "calib.txt"
    calib.write_text("some calibration text " * 50)
    pruned = compose_cfg(["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
                          "pruner=wanda", "calib=file", f"calib.path={calib}", "calib.seq_len=64"])
    inputs = job_inputs(pruned, validate(pruned))
    assert set(inputs) == {"task:local_mc", "calib"}
    assert inputs["calib"] == {str(calib.resolve()): hashlib.sha256(calib.read_bytes()).hexdigest()}


def test_a_file_rewritten_is_hashed_again_and_a_folder_by_its_names_and_sizes(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("one\n")
    first = digest(path)
    path.write_text("two, longer\n")
    assert digest(path) == hashlib.sha256(b"two, longer\n").hexdigest() != first
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "x.png").write_bytes(b"12")
    before = digest(folder)
    (folder / "y.png").write_bytes(b"3")
    assert digest(folder) != before


def test_piqas_labels_file_is_an_input_of_its_own(tmp_path):
    """PIQA's release keeps the answers beside the questions: relabelling one is a changed input."""
    folder = tmp_path / "piqa"
    shutil.copytree(FIXTURES / "benchmarks" / "piqa", folder)
    cfg = compose_cfg(["model=tiny-llama", "task=piqa", f"task.tasks.piqa.source.path={folder / 'valid.jsonl'}",
                       "pruner=none"])
    inputs = job_inputs(cfg, validate(cfg))["task:piqa"]
    labels = folder / "valid-labels.lst"
    assert set(inputs) == {str((folder / "valid.jsonl").resolve()), str(labels.resolve())}
    flipped = [str(1 - int(v)) for v in labels.read_text().split()]
    labels.write_text("\n".join(flipped) + "\n")
    assert job_inputs(cfg, validate(cfg))["task:piqa"][str(labels.resolve())] != inputs[str(labels.resolve())]


def test_a_dataset_another_job_registers_at_the_same_moment_is_linked_not_a_failure(store, monkeypatch):
    """Jobs of a sweep starting together on a fresh store log the same file: MLflow looks the dataset
    up, then inserts it, and the job losing that race got a unique-key error and FAILED (seen in the
    SLURM test). Played in that order here: the other job's insert lands first, then MLflow's error."""
    import sqlalchemy
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    original, raced = SqlAlchemyStore.log_inputs, []

    def racing(self, run_id, datasets=None, models=None):
        if datasets and not raced:
            other = MlflowClient(store).create_run(self.get_run(run_id).info.experiment_id)
            original(self, other.info.run_id, datasets, models)
            raced.append(other.info.run_id)
            raise MlflowException(sqlalchemy.exc.IntegrityError("INSERT INTO datasets", {}, Exception("UNIQUE")))
        return original(self, run_id, datasets, models)

    monkeypatch.setattr(SqlAlchemyStore, "log_inputs", racing)
    assert run(compose_cfg(tiny_mc(MC_FIXTURE))) is not None
    client = MlflowClient(store)
    (job,) = [r for r in client.search_runs([client.get_experiment_by_name("prunebench").experiment_id])
              if r.info.run_id not in raced]
    assert raced and job.info.status == "FINISHED"
    (logged,) = job.inputs.dataset_inputs
    (other,) = client.get_run(raced[0]).inputs.dataset_inputs
    assert logged.dataset.digest == other.dataset.digest  # one dataset, linked to both runs
