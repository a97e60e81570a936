"""Every `conf/recovery` option trains one step of its recipe through the job (tiny-llama pruned by
magnitude, a local text file in place of the recipe's hub data, one optimizer step) and records it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY_MC, compose_cfg
from helpers.recovery import ONE_STEP, TEXT
from prunebench import job
from prunebench.paths import CONF_DIR


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF_DIR) / "recovery").glob("*.yaml") if p.stem != "none"))
def test_every_recovery_option_trains_a_step(option, store, tmp_path, one_thread):
    text = tmp_path / "recovery.txt"
    text.write_text(TEXT * 30)
    cfg = compose_cfg([*TINY_MC, "pruner=magnitude", "sparsity=0.5", "limit=2", "tracking.ensure_dense=false",
                       f"recovery={option}", "recovery.data=file", *ONE_STEP, f"recovery.path={text}"])
    metrics = job.run(cfg)
    assert metrics["recovery/steps"] == 1, option
    assert metrics["recovery/nonzero_delta"] == 0, option  # the pruning's zeros kept through training
