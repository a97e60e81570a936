"""Paper presets: each composes and validates job by job with tiny models and self-written data
standing in for the real ones, its grid has the size the README states, the plan reads the store
without writing to it, and the first two jobs of its grid and their dense baseline finish."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import FIXTURES, compose_cfg, planned_sweep
from prunebench import job
from prunebench.paths import CONF_DIR
from prunebench.cli import plan_main
from prunebench.composer import Composer
from prunebench.plan import DENSE, format_plan
from prunebench.tracking.sweep import SweepRunCallback
from helpers.presets import GRIDS, QUICK, tiny

def preset_plan(name: str, extra: list[str]):
    return planned_sweep([f"experiment={name}", *extra])


PLANNED: dict[str, list] = {}  # each preset's plan as its grid test made it, for its jobs test


def test_a_plan_composes_each_job_as_hydra_composes_it(preset_data):
    """The plan builds the defaults tree once per set of group choices and applies the values to a
    copy: every job must equal Hydra's own compose of its overrides, whatever kinds they mix."""
    extra = [*tiny("hies_bert_glue", preset_data), "+pruner.extra=1", "task.tasks={}", "pruner.scope=layer"]
    jobs = [j.overrides for j in planned_sweep(["experiment=hies_bert_glue", *extra],
                                               ["finetuned=bert-base-sst2,bert-base-rte", "pruner=heads_l2,hies_paper",
                                                "sparsity=0.1,0.3"]) if j.overrides[0] != DENSE]
    assert len(jobs) == 8
    jobs += [["model=tiny-llama", "limit=3", "hydra.job.chdir=true"], ["model=tiny-llama", "calib=c4", "limit=4"],
             ["model=tiny-llama", "task=[commonsense,openbookqa]", "task.name=commonsense", "limit=2"],
             # a group the defaults list lacks, appended (dsnot's `+sparsity_type` axis), and a new root key
             ["experiment=dsnot", "model=tiny-llama", "+sparsity_type=nm_2_4", "pruner=wanda", "limit=2"],
             ["model=tiny-llama", "+lab_note=hello", "sparsity=0.3"],
             ["model=tiny-llama", "pruner=random", "+base_seed=3", "seed=${base_seed}", "sparsity=${seed}"],
             # values for a preset's mandatory `???` paths: set on the cached tree, as Hydra sets them
             ["experiment=hies_vit", "finetuned=vit-large-cifar100", "pruner=heads_l2", *tiny("hies_vit", preset_data)]]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        compose_job = Composer("config")
        for overrides in jobs:
            expected = OmegaConf.to_container(compose("config", overrides=overrides))
            assert OmegaConf.to_container(compose_job(overrides)) == expected, overrides
            assert OmegaConf.to_container(compose_job(overrides)) == expected, overrides  # from its cached tree


def test_every_preset_option_is_a_preset_with_a_grid():
    presets = sorted(p.stem for p in (FIXTURES.parents[1] / "conf" / "experiment").glob("*.yaml"))
    assert presets == sorted(GRIDS)


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_preset_grid_composes_and_validates_with_tiny_models(name, preset_data, fresh_store):
    jobs = PLANNED[name] = preset_plan(name, tiny(name, preset_data))
    grid = [j for j in jobs if j.overrides[0] != DENSE]
    assert [j.note for j in jobs if j.status == "invalid"] == []
    assert (len(grid), len(jobs) - len(grid)) == GRIDS[name]
    assert {j.status for j in jobs} == {"left"}
    assert not Path(fresh_store.removeprefix("sqlite:///")).exists()  # validated without touching the store


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_preset_first_two_jobs_run_on_tiny_models(name, preset_data, store):
    """The grid's first two jobs in launch order: the plan above holds them (the sweeper's expansion,
    without its validation where this test runs alone)."""
    grid = ([j.overrides for j in PLANNED[name] if j.overrides[0] != DENSE] if name in PLANNED
            else planned_sweep([f"experiment={name}", *tiny(name, preset_data)], validated=False))
    for overrides in grid[:2]:  # from the trees the plan composed (its equality to Hydra's: above)
        job.run(compose_cfg(overrides), overrides)
    runs = mlflow.search_runs(experiment_names=["prunebench"], filter_string="attributes.status = 'FINISHED'")
    assert len(runs) == 3  # the two jobs and their dense baseline, evaluated first


def test_plan_counts_finished_runs_and_writes_nothing(store, capsys):
    overrides = ["experiment=hies_llama2", "model=tiny-llama", "task=local_mc",
                 f"task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}", *QUICK]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        job.run(compose("config", overrides=[*overrides, "pruner=heads_random", "sparsity=0.1"]))  # + its dense run
    before = mlflow.search_runs(experiment_names=["prunebench"])
    assert plan_main(overrides) == 0
    printed = capsys.readouterr().out
    jobs = preset_plan("hies_llama2", overrides)
    assert [j.status for j in jobs].count("done") == 2 and jobs[0].status == "done" and jobs[-1].status == "done"
    assert "30 grid jobs + 1 dense baseline(s): 2 done, 29 left, 0 invalid" in printed
    assert len(mlflow.search_runs(experiment_names=["prunebench"])) == len(before) == 2


def test_sweep_with_plan_true_prints_the_plan_and_launches_nothing(fresh_store, capsys):
    overrides = ["experiment=dynmoe_olmoe", "model=tiny-olmoe", "task=local_mc",
                 f"task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}", "plan=true"]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        OmegaConf.set_struct(cfg, False)
        cfg.hydra.overrides.task = overrides
        with pytest.raises(SystemExit) as stop:
            SweepRunCallback(planner="prunebench.plan.sweep_plan").on_multirun_start(cfg)
    assert stop.value.code == 0
    assert "5 grid jobs + 1 dense baseline(s): 0 done, 6 left" in capsys.readouterr().out
    assert not Path(fresh_store.removeprefix("sqlite:///")).exists()


def test_plan_marks_a_job_that_cannot_run_and_the_repeats():
    jobs = planned_sweep(["model=tiny-llama", "limit=4"], ["pruner=none,magnitude", "sparsity=0,1.5,0.3"])
    assert [j.status for j in jobs] == ["left", "invalid", "repeat", "repeat", "invalid", "left"]
    assert "sparsity=1.5 is outside [0, 1)" in jobs[1].note and jobs[3].note == "same run key as #0"
    assert "6 grid jobs + 0 dense baseline(s): 0 done, 2 left, 2 invalid, 2 repeated" in format_plan(jobs)
