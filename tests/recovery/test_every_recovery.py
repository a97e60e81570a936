"""Every `conf/recovery` option trains one step of its recipe through the job (tiny-llama pruned by
magnitude, a local text file in place of the recipe's hub data, one optimizer step) and records it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY_MC, compose_cfg
from helpers.recovery import TEXT
from prunebench import job
from prunebench.paths import CONF_DIR

QUICK = ["recovery.data=file", "recovery.seq_len=32", "recovery.batch_size=2", "recovery.micro_batch_size=2",
         "recovery.val_samples=2", "recovery.max_steps=1", "recovery.warmup_steps=0", "recovery.val_every=1",
         "recovery.schedule_steps=null", "recovery.n_samples=null"]


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF_DIR) / "recovery").glob("*.yaml") if p.stem != "none"))
def test_every_recovery_option_trains_a_step(option, store, tmp_path, one_thread):
    text = tmp_path / "recovery.txt"
    text.write_text(TEXT * 30)
    cfg = compose_cfg([*TINY_MC, "pruner=magnitude", "sparsity=0.5", "limit=2", "tracking.ensure_dense=false",
                       f"recovery={option}", *QUICK, f"recovery.path={text}"])
    metrics = job.run(cfg)
    assert metrics["recovery/steps"] == 1, option
    assert metrics["recovery/nonzero_delta"] == 0, option  # the pruning's zeros kept through training
