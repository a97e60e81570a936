"""Paper presets run: each preset's first two jobs and their dense baseline finish on the tiny models
and self-written data that test_presets.py plans them with (its `tiny` overrides and `data` fixture).
A module of its own so that `make test`'s workers run these jobs beside the presets' plans."""

from __future__ import annotations

import mlflow
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from prunebench import job
from prunebench.paths import CONF_DIR
from prunebench.plan import sweep_jobs
from test_presets import GRIDS, data, judge, tiny  # noqa: F401 (data and judge: the presets' module fixtures)


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_preset_first_two_jobs_run_on_tiny_models(name, data, store):
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        params = OmegaConf.to_container(compose("config", overrides=[f"experiment={name}"],
                                                return_hydra_config=True).hydra.sweeper.params)
        first_two = sweep_jobs(params, [f"experiment={name}"])[:2]
        for overrides in first_two:
            job.run(compose("config", overrides=[*overrides, *tiny(name, data)]), overrides)
    runs = mlflow.search_runs(experiment_names=["prunebench"], filter_string="attributes.status = 'FINISHED'")
    assert len(runs) == 3  # the two jobs and their dense baseline, evaluated first
