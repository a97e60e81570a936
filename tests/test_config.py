"""Every config option composes, and bad values fail before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from conftest import TINY_MC, compose_cfg
from prunebench.bench.checks import check_bench
from prunebench.calibration import calibration_config
from prunebench.paths import CONF_DIR
from prunebench.validate import ConfigError, validate


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


# every group a user chooses from, but two whose every option is built elsewhere: `task`
# (tasks/test_every_task.py builds each option's tasks and their first documents) and `experiment`
# (test_presets.py composes and validates each preset's whole grid; a preset has no `_target_`);
# what an option leaves to the user (???) is given here as a user would
GROUPS = ["model", "pruner", "calib", "tracking", "trainer", "bench", "recovery", "judge", "finetuned", "mop_run",
          "sparsity_type", "export"]
BUILT_ELSEWHERE = {"task", "experiment"}
NOT_CHOSEN = {"hydra", "task_base"}  # Hydra's own settings; the bases the task options build on
GIVEN = {"judge": ["judge.model=m", "judge.path=/models/judge"], "model": ["model.path=/models/m", "model.arch=vit_tiny"],
         "calib": ["calib.path=/data/calib.txt", "calib.task.tasks.local_mc.source.path=/data/train.jsonl"]}
BENCH_MODELS = {"vision": "tiny-vit", "vlm_generate": "tiny-llava"}  # a model of a family each times
# a labelled calibration takes the evaluated task's train split: a classification task to take it from
CALIB_TASKS = {"labelled": ["model=tiny-bert-cls", "task=sst2"], "glue_train": ["model=tiny-bert-cls", "task=sst2"],
               "image_text": ["model=tiny-llava", "task=easy_vqa"]}
ADDED = {"sparsity_type"}  # chosen with +: a preset's building block, in no defaults list


def missing(node: DictConfig, dotted: str) -> bool:
    """`group.key` (the group's node given) is left to the user (???)."""
    try:
        OmegaConf.select(node, dotted.split(".", 1)[1], throw_on_missing=True)
    except MissingMandatoryValue:
        return True
    return False


def test_no_group_is_left_out():
    folders = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()}
    assert folders - NOT_CHOSEN == set(GROUPS) | BUILT_ELSEWHERE


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_builds(group):
    """Each option composes, and each node with a `_target_` resolves (a model's loader, which would
    load weights) or is instantiated (the rest: pruners, calibrations, judges, benches, trainers)."""
    assert options(group), group
    for option in options(group):
        choice = f"{'+' if group in ADDED else ''}{group}={option}"
        cfg = compose_cfg([choice])
        node = cfg.get(group) if group in cfg else None
        given = [g for g in GIVEN.get(group, []) if isinstance(node, DictConfig) and missing(node, g.split("=")[0])]
        given += [f"model={BENCH_MODELS[option]}"] if group == "bench" and option in BENCH_MODELS else []
        given += CALIB_TASKS.get(option, []) if group == "calib" else []
        cfg = compose_cfg([choice, *given]) if given else cfg
        node = cfg.get(group) if group in cfg else None
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        if group == "model":
            assert callable(get_method(node._target_)), option
        elif group == "trainer":
            assert get_class(node._target_), option
        elif group == "bench":
            check_bench(cfg)  # the job's own build of it
        elif group == "calib":
            assert instantiate(calibration_config(cfg), _convert_="all") is not None, option
        else:
            assert instantiate(node, _convert_="all") is not None, (group, option)


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
