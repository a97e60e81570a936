"""OpenCompass's PPL protocol on a tiny model: its per-option value against a direct computation
from the model's full logits, the lowest-wins rule, option filtering, and a whole job."""

from __future__ import annotations

import lightning as L
import mlflow
import pytest
import torch
import torch.nn.functional as F

from conftest import FIXTURES, compose_cfg
from prunebench.evaluation.sequence_ppl import SequencePPLDataModule, SequencePPLModule
from prunebench.job import run
from prunebench.models.tiny import load_tiny
from prunebench.tasks.opencompass import PPLChoiceTask
from prunebench.tasks.sources import JsonSource

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
PIQA = dict(prompt="The following makes sense: \nQ: {{goal}}\nA: {{option}}\n", doc_to_choice="{{[sol1, sol2]}}",
            doc_to_target="label")


def piqa_task(**kwargs) -> PPLChoiceTask:
    return PPLChoiceTask("piqa", JsonSource(str(FIXTURES / "piqa_mini.jsonl")), **{**PIQA, **kwargs})


def opencompass_value(model, ids: list[int]) -> float:
    """OpenCompass's get_ppl for one unpadded row: CE of tokens 1.. summed, over all tokens."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item() / len(ids)


def test_option_values_equal_opencompass_get_ppl_and_the_lowest_wins():
    tiny = load_tiny(name="tiny", config=CONFIG)
    task = piqa_task()
    data = SequencePPLDataModule(task, tiny.tokenizer, tiny.max_length, batch_tokens=64)
    module = SequencePPLModule(tiny.model, "piqa")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    acc = trainer.test(module, datamodule=data, verbose=False)[0]["piqa/acc"]
    assert len(data.batches) > 1                                     # the budget splits the documents
    assert acc == pytest.approx(sum(r["acc"] for r in module.records) / 3)
    for record in module.records:
        inst = task.instances()[record["doc_id"]]
        expected = [opencompass_value(tiny.model, tiny.tokenizer.encode(t)) for t in inst.texts]
        assert tiny.tokenizer.encode(inst.texts[0])[0] == tiny.tokenizer.bos_token_id
        assert record["mean_ce"] == pytest.approx(expected, abs=1e-4)
        assert record["pred"] == expected.index(min(expected))


def test_prompt_renders_the_option_and_n_choices_drops_other_items():
    inst = piqa_task().instances(1)[0]
    assert inst.texts[1] == ("The following makes sense: \nQ: How do I keep bread fresh?\n"
                             "A: Store it in a bucket of water.\n")
    assert inst.gold == 0
    assert piqa_task(n_choices=3).docs() == []


def test_opencompass_task_in_a_job(store):
    overrides = ["model=tiny-llama", "pruner=none", "trainer.enable_progress_bar=false", "task=dynmoe_opencompass",
                 "~task.tasks.hellaswag", "~task.tasks.arc_easy", "~task.tasks.bbh_cot_fewshot",
                 f"task.tasks.piqa.source.path={FIXTURES / 'piqa_mini.jsonl'}"]
    metrics = run(compose_cfg(overrides))
    assert 0.0 <= metrics["piqa/acc"] <= 1.0 and "piqa/acc_stderr" in metrics
    assert metrics["avg/score"] == metrics["piqa/acc"]
    assert mlflow.search_runs(experiment_names=["prunebench"])["tags.prunebench.protocol"].tolist() == ["opencompass"]
