"""The run key's contract (tracking/run_key.py CONTRACT): the keys of representative configs are
pinned as prunebench 95e5a63 computed them, so a store filled before an upgrade is still found
"done"; every root key of prunebench's configs is declared."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, compose_cfg
from prunebench.tracking.run_key import CONTRACT, RUNTIME, drop, run_key, undeclared

GOLDEN = {name: case for name, case in json.loads((FIXTURES / "golden" / "run_keys.json").read_text()).items()
          if not name.startswith("_")}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_pinned_config_keeps_its_run_key(name):
    case = GOLDEN[name]
    assert run_key(compose_cfg(case["overrides"]), case.get("inputs")) == case["key"], (
        f"{name}'s run key moved: every stored run like it would be rerun; if that is meant, change "
        f"tests/fixtures/golden/run_keys.json and write the migration in docs/run-keys.md")


def test_runtime_fields_and_fields_at_their_since_value_leave_the_key_alone():
    base = ["model=tiny-llama", "pruner=magnitude", "sparsity=0.5", "limit=8"]
    key = run_key(compose_cfg(base))
    for extra in (["tracking.experiment=elsewhere"], ["trainer.enable_progress_bar=false"], ["model.device=cuda:1"],
                  ["eval.batch_tokens=999"], ["pruner.tower=language"], ["fail_fast=true"],
                  ["export=hf", "export.dir=/tmp/x", "export.padded=true"]):
        assert run_key(compose_cfg([*base, *extra])) == key, extra
    for extra in (["limit=9"], ["model.dtype=bfloat16"], ["sparsity=0.4"], ["seed=1", "pruner=random"]):
        assert run_key(compose_cfg([*base, *extra])) != key, extra


def test_a_field_is_left_out_at_every_key_a_star_stands_for():
    data = {"task": {"tasks": {"a": {"judge": {"url": "u", "repeats": 1}}, "b": {"judge": {"url": "v", "repeats": 3}}}}}
    for field in CONTRACT:
        if field.path.startswith("task.tasks.*.judge."):
            drop(data, field.path.split("."), field)
    assert data == {"task": {"tasks": {"a": {"judge": {}}, "b": {"judge": {"repeats": 3}}}}}


GROUP_OPTIONS = [["model=tiny-bert-cls"], ["model=tiny-vit", "task=cifar100"], ["model=tiny-llava", "task=easy_vqa"],
                 ["experiment=hies_vit"], ["experiment=mop_llava"], ["experiment=owl"], ["recovery=lora"],
                 ["bench=llm_generate"], ["export=hf"], ["judge=openai_compatible"], ["finetuned=bert-base-cola"], ["mop_run=seed1"]]


@pytest.mark.parametrize("overrides", GROUP_OPTIONS, ids=lambda o: o[0])
def test_every_root_key_of_the_configs_is_declared(overrides):
    assert undeclared(compose_cfg(overrides)) == []
    assert all(f.role in ("identity", RUNTIME) for f in CONTRACT)
