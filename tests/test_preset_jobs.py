"""Paper presets run: each preset's first two jobs and their dense baseline finish on the tiny models
and self-written data that test_presets.py plans them with (helpers/presets.py's `tiny` overrides, conftest's `preset_data`).
A module of its own so that `make test`'s workers run these jobs beside the presets' plans."""

from __future__ import annotations

import mlflow
import pytest
from hydra import compose, initialize_config_dir

from conftest import planned_sweep
from prunebench import job
from prunebench.paths import CONF_DIR
from helpers.presets import GRIDS, tiny


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_preset_first_two_jobs_run_on_tiny_models(name, preset_data, store):
    first_two = planned_sweep([f"experiment={name}", *tiny(name, preset_data)], validated=False)[:2]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for overrides in first_two:
            job.run(compose("config", overrides=overrides), overrides)
    runs = mlflow.search_runs(experiment_names=["prunebench"], filter_string="attributes.status = 'FINISHED'")
    assert len(runs) == 3  # the two jobs and their dense baseline, evaluated first
