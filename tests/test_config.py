"""Every config option composes, and bad values fail before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from conftest import TINY_MC, compose_cfg
from prunebench.paths import CONF_DIR
from prunebench.validate import ConfigError, validate


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "pruner", "task", "calib", "tracking", "trainer", "bench"])
def test_every_option_composes(group):
    assert options(group), group
    for option in options(group):
        cfg = compose_cfg([f"{group}={option}"])
        OmegaConf.to_container(cfg[group], resolve=False)


def test_defaults_are_the_make_run_setup():
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.pruner.name, cfg.task.name) == ("gemma3-270m", "magnitude", "commonsense")
    assert list(cfg.task.tasks) == ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande"]


@pytest.mark.parametrize("value", ["1.5", "1.0", "-0.1", "abc"])
def test_sparsity_outside_unit_interval_is_refused(value):
    with pytest.raises(ConfigError, match=f"sparsity={value!r}|sparsity={value}"):
        validate(compose_cfg(TINY_MC + [f"sparsity={value}"]))


def test_limit_must_be_positive():
    with pytest.raises(ConfigError, match="limit=0"):
        validate(compose_cfg(TINY_MC + ["limit=0"]))


def test_pruner_that_cannot_apply_to_the_model_family():
    with pytest.raises(ConfigError, match="cannot apply to model='tiny-llama'.*family 'vision'"):
        validate(compose_cfg(TINY_MC + ["model.family=vision"]))


def test_missing_data_file_is_named():
    with pytest.raises(ConfigError, match="/nope/missing.jsonl"):
        validate(compose_cfg(TINY_MC + ["task.tasks.local_mc.source.path=/nope/missing.jsonl"]))


def test_unknown_task_is_a_hydra_error_naming_it():
    with pytest.raises(MissingConfigException, match="task/nope"):
        compose_cfg(["task=nope"])


def test_unknown_experiment_is_a_hydra_error_naming_it():
    with pytest.raises(MissingConfigException, match="experiment/nope"):  # it used to run the default job
        compose_cfg(["experiment=nope"])


def test_valid_config_returns_checked_tasks():
    tasks = validate(compose_cfg(TINY_MC))
    assert list(tasks) == ["local_mc"]


@pytest.mark.parametrize(("text", "where"), [
    ('{"question": "a", "choices": ["x", "y"], "label": 0}\n{"question": "b", "choices": ["x", "y"] "label": 1}\n',
     "line 2, column 41"),
    ('[{"question": "a"},\n {"question": }]', "line 2, column 15"),
    ('"just a string"', "must be JSON objects")])
def test_a_malformed_task_file_is_named_with_its_line_before_any_model_loads(tmp_path, text, where):
    path = tmp_path / ("docs.jsonl" if text.count("\n") > 1 else "docs.json")
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(TINY_MC + [f"task.tasks.local_mc.source.path={path}"]))
    assert str(path) in str(err.value) and where in str(err.value)


@pytest.mark.parametrize(("doc", "message"), [
    ({"question": "q?", "choices": ["a", "b"], "label": 5}, r"document 1 .*gold answer 5 is not one of its 2 choices"),
    ({"question": "q?", "choices": ["a", "b"], "label": -1}, r"document 1 .*gold answer '-1'"),
    ({"question": "q?", "choices": [], "label": 0}, r"document 1 .*no choices"),
    ({"prompt": "q?", "choices": ["a", "b"], "label": 0}, r"document 1 .*names a field the document lacks.*question")])
def test_bad_documents_are_named_before_any_model_loads(tmp_path, doc, message):
    path = tmp_path / "docs.jsonl"
    good = {"question": "fine?", "choices": ["yes", "no"], "label": 0}
    path.write_text(json.dumps(good) + "\n" + json.dumps(doc) + "\n")
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(TINY_MC + [f"task.tasks.local_mc.source.path={path}"]))
