"""The "how to add" recipes of docs/architecture.md, held true: a multiple-choice task from a JSONL is one config
file, and a new request kind is one engine plus its registration, run through the whole job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import lightning as L
import mlflow
import pytest
import torch
import torchmetrics
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from torch.utils.data import DataLoader

from conftest import MC_FIXTURE, TINY_MC, compose_cfg
from prunebench import job
from prunebench.api.metrics import mean_stderr
from prunebench.api.requests import Document
from prunebench.paths import CONF_DIR
from prunebench.api.metrics import readable
from prunebench.evaluation import registry

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "pruner=none"]

# docs/architecture.md's recipe: this file as conf/task/capitals.yaml (here in a folder on Hydra's search path)
CAPITALS = f"""
name: capitals
tasks:
  capitals:
    _target_: prunebench.tasks.multiple_choice.MultipleChoiceTask
    name: capitals
    source:
      _target_: prunebench.tasks.sources.JsonSource
      path: {MC_FIXTURE}
    doc_to_text: "Q: {{{{question}}}}\\nA:"
    doc_to_choice: "{{{{choices}}}}"
    doc_to_target: "{{{{label}}}}"
    metrics: [acc, acc_norm]
"""


def test_a_multiple_choice_task_from_a_jsonl_is_one_config_file(tmp_path, store):
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "capitals.yaml").write_text(CAPITALS)
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", "task=capitals", *QUIET,
                                           f"hydra.searchpath=[file://{tmp_path}]"])
    metrics = job.run(cfg)
    assert 0 <= metrics["capitals/acc_norm"] <= 1 and metrics["avg/score"] == metrics["capitals/acc_norm"]


# A new request kind, "token_count": how many tokens the model's tokenizer makes of a text.
TOKEN_COUNT = "token_count"


@dataclass
class TokenCountTask:
    """Tasks of the new kind are data like any other: documents -> requests, process_results."""

    kind: ClassVar[str] = TOKEN_COUNT
    lower_is_better: ClassVar[bool] = False

    name: str
    texts: list[str]
    metrics: tuple = ("tokens",)
    primary: str = "tokens"

    def check(self) -> None:
        pass

    def instances(self, limit: int | None = None) -> list[Document]:
        return [Document(i, [text]) for i, text in enumerate(self.texts[:limit])]

    def process_results(self, document: Document, responses: list[int]) -> dict:
        return {"doc_id": document.doc_id, "text": document.requests[0], "tokens": float(responses[0])}


class TokenCountModule(L.LightningModule):
    """The engine's LightningModule: answers a batch of requests, scores them by the task, torchmetrics."""

    def __init__(self, model, task):
        super().__init__()
        self.tokenizer, self.task = model.tokenizer, task
        self.mean = torchmetrics.MeanMetric()
        self.records: list[dict] = []

    def test_step(self, batch: list[Document], batch_idx: int) -> None:
        for document in batch:
            record = self.task.process_results(document, [len(self.tokenizer.encode(document.requests[0]))])
            self.mean.update(record["tokens"])
            self.records.append(record)
        self.log(f"{self.task.name}/tokens", self.mean, on_step=False, on_epoch=True, batch_size=len(batch))

    def stderr(self, name: str) -> float:
        return mean_stderr([r[name] for r in self.records])


class TokenCountData(L.LightningDataModule):
    def __init__(self, documents: list[Document]):
        super().__init__()
        self.documents = documents

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.documents, batch_size=2, collate_fn=list)


def token_count_engine(task, model, limit, options):
    """The engine: (task, model adapter, limit, eval options) -> (datamodule, module)."""
    return TokenCountData(task.instances(limit)), TokenCountModule(model, task)


def test_a_new_request_kind_is_one_engine_and_its_registration(store, monkeypatch):
    monkeypatch.setattr(registry, "ENGINES", dict(registry.ENGINES))  # the registration ends with the test
    registry.register(TOKEN_COUNT, token_count_engine)
    cfg = compose_cfg([*TINY_MC, *QUIET])
    texts = ["The quick brown fox", "Paris", "How many legs do horses have?"]
    with open_dict(cfg):
        cfg.task.name = "counts"
        cfg.task.tasks = {"counts": {"_target_": f"{__name__}.TokenCountTask", "name": "counts", "texts": texts}}
    metrics = job.run(cfg)
    from prunebench.models.tiny import tiny_tokenizer

    counts = [len(tiny_tokenizer().encode(t)) for t in texts]
    # logged as the float32 mean's shortest decimal (api.metrics.readable)
    assert metrics["counts/tokens"] == readable(torch.tensor(counts, dtype=torch.float).mean().item())
    assert metrics["counts/tokens_stderr"] == mean_stderr(counts)
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="predictions/counts.jsonl")
    assert [line.count('"tokens"') for line in open(path)] == [1, 1, 1]


def test_text_engines_refuse_requests_with_images():
    """Until an engine feeds images, a request carrying one fails instead of being scored as text."""
    from prunebench.api.requests import Loglikelihood
    from prunebench.evaluation.loglikelihood.engine import LoglikelihoodDataModule
    from prunebench.models.cache import get_model
    from prunebench.tasks.multiple_choice import Instance, MultipleChoiceTask

    task = MultipleChoiceTask("pictures", None, "{{q}}", "{{c}}", "{{a}}", metrics=["acc"], primary="acc")
    data = LoglikelihoodDataModule(task, get_model(compose_cfg(["model=tiny-llama"]).model))
    with pytest.raises(ValueError, match="document 3: its requests carry images"):
        data.encode(Instance(3, [Loglikelihood("What is shown?", " a cat", images=("cat.png",))], {}, 0, [5]))
