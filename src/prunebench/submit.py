"""Which cells of a sweep a prunebench launcher submits: rerunning a sweep command while an earlier
(detached) sweep of it still runs submits only the cells with neither a FINISHED run nor a live
claim. The others are recorded on the new sweep's parent as cells answered elsewhere, so its report
covers the whole grid (as a job that skips does, `tracking.sweep.record_cell`)."""

from __future__ import annotations

import logging
import os
from typing import Callable, Sequence

from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, open_dict, read_write

from prunebench.inputs import job_inputs
from prunebench.tracking import claim, store
from prunebench.tracking.run_key import run_key
from prunebench.tracking.sweep import PARENT_ENV, record_cell

log = logging.getLogger(__name__)


def cells_left(job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
               compose: Callable[[list[str]], DictConfig]) -> dict[int, list[str]]:
    """{Hydra job number: overrides} of the cells to submit. A cell that does not compose or
    validate is submitted: its job records it FAILED with the reason, as every job does."""
    from prunebench.pruning import key_by_removed
    from prunebench.validate import validate

    parent = os.environ.get(PARENT_ENV)
    left = {}
    for num, overrides in enumerate(job_overrides, start=initial_job_idx):
        try:
            cfg = compose(list(overrides))
            with read_write(cfg), open_dict(cfg):  # the job's config, as Hydra's run_job hands it over
                del cfg["hydra"]
            tasks = validate(cfg, overrides=list(overrides))
            key_by_removed(cfg)
            key = run_key(cfg, job_inputs(cfg, tasks))
        except Exception as err:
            log.warning("submitting #%d without looking for its runs: %s: %s", num, type(err).__name__, err)
            left[num] = list(overrides)
            continue
        answer = answered(cfg, key) if cfg.tracking.skip_existing and parent else None
        if answer is None:
            left[num] = list(overrides)
            continue
        uri, run = answer
        log.info("not submitting #%d (%s): run %s of its key is %s", num, " ".join(overrides), run.info.run_id,
                 run.info.status)
        record_cell(uri, parent, run)
    return left


def answered(cfg: DictConfig, key: str):
    """(store, the key's FINISHED run or its live claim), or None when the cell must run."""
    uri = store.tracking_uri(cfg.tracking.uri)
    client = MlflowClient(uri)
    runs = claim.key_runs(client, store.experiment_id(uri, cfg.tracking.experiment), key)
    done = [r for r in runs if r.info.status == "FINISHED"]
    if done:
        return uri, done[0]
    me = claim.worker_id()
    live = [r for r in runs if r.info.status == "RUNNING" and claim.holder_gone(r, me, cfg.tracking.claim.stale_s) is None]
    return (uri, live[0]) if live else None
