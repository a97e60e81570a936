"""A sweep's cells (its Hydra jobs, by job number) as the store and SLURM know them.

Two kinds of tags on the parent run, each with one writer, so no write overwrites another's:
`prunebench.array.<n>` by the submitting launcher (the cell's overrides and its SLURM array task),
and `prunebench.job.<n>` by the job itself (RUNNING when it starts, then how it ended). A job killed
outright writes no end: SLURM's word on its task, or off SLURM its claim's heartbeat, tells.

A sweep that is not detached records its grid the same way when it starts (`{"local": true}`, no
SLURM task) and the process running it (`SWEEP_WORKER_TAG`): once that process is gone (Ctrl-C,
SIGKILL, a node lost), a cell it never started is `left` (the same command again runs it), not
waiting for a process that will never come."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from mlflow.tracking import MlflowClient

from prunebench.tracking import claim

ARRAY_TAG = "prunebench.array."
JOB_TAG = "prunebench.job."
SWEEP_WORKER_TAG = "prunebench.sweep_worker"
# a job's own ends; a KILLED one (a signal) may be a requeue's, which only SLURM can tell apart
DONE, FAILED, KILLED = ("FINISHED", "SKIPPED"), "FAILED", "KILLED"


@dataclass
class Cell:
    num: int
    overrides: str = ""
    slurm: str | None = None  # the array task, as squeue names it (1234_5)
    job: dict = field(default_factory=dict)  # the job's own tag: state, worker, start, end, error
    state: str = "waiting"  # done | running | failed | waiting | killed | submitting | left
    detail: str = ""
    slurm_state: str | None = None  # squeue's word on its task (GONE: no longer listed); None: no answer
    # False where this host cannot tell a requeued SLURM task from a dead one (no squeue here)
    certain: bool = True

    @property
    def ended(self) -> bool:
        return self.state in ("done", "failed", "killed", "left") and self.certain

    @property
    def duration_s(self) -> float | None:
        finished = self.job.get("state") == "FINISHED" and "end" in self.job
        return self.job["end"] - self.job["start"] if finished else None


def record_array(client: MlflowClient, parent_run_id: str, cells: dict[int, dict]) -> None:
    """{job number: {"overrides": ..., "slurm": task id, None before submission}}."""
    from mlflow.entities import RunTag

    tags = [RunTag(f"{ARRAY_TAG}{num}", json.dumps(value)) for num, value in cells.items()]
    for start in range(0, len(tags), 100):  # MLflow's limit of tags per batch
        client.log_batch(parent_run_id, tags=tags[start:start + 100])


def job_tag(client: MlflowClient, parent_run_id: str, num: int, state: dict) -> None:
    client.set_tag(parent_run_id, f"{JOB_TAG}{num}", json.dumps(state))


def numbered(tags: dict[str, str], prefix: str) -> dict[int, dict]:
    return {int(k[len(prefix):]): json.loads(v) for k, v in tags.items() if k.startswith(prefix)}


def sweep_gone(parent) -> str | None:
    """Why nothing will start another of this sweep's cells: it is closed, or the process running
    a sweep that is not detached is gone; None while it may still run them (a detached sweep's
    cells are SLURM's to start)."""
    if parent.info.status != "RUNNING":
        return f"the sweep is {parent.info.status}"
    worker = parent.data.tags.get(SWEEP_WORKER_TAG)
    return claim.worker_gone(worker) if worker else None


def read_cells(client: MlflowClient, run_id: str, stale_s: float) -> list[Cell]:
    """Each cell's state. SLURM is asked before the tags are read: a job writes its end before its
    process exits, so a task SLURM no longer runs whose tag still says RUNNING was killed outright."""
    arrays = numbered(client.get_run(run_id).data.tags, ARRAY_TAG)
    slurm: dict[str, str] | None = {}
    for array in sorted({a["slurm"].split("_")[0] for a in arrays.values() if a.get("slurm")}):
        states = claim.slurm_states(array)
        slurm = None if states is None or slurm is None else {**slurm, **states}
    parent = client.get_run(run_id)
    arrays, jobs = numbered(parent.data.tags, ARRAY_TAG), numbered(parent.data.tags, JOB_TAG)
    running = {r.data.tags.get(claim.WORKER_TAG): r for r in client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'RUNNING'",
        max_results=1000)}
    gone = sweep_gone(parent)
    cells = []
    for num in sorted(arrays.keys() | jobs.keys()):
        job, array = jobs.get(num, {}), arrays.get(num, {})
        cell = Cell(num, array.get("overrides", job.get("overrides", "")), array.get("slurm"), job)
        judge(cell, slurm, running.get(cell.job.get("worker")), stale_s,
              submitted=num not in arrays or bool(cell.slurm) or bool(array.get("local")), gone=gone)
        cells.append(cell)
    return cells


def judge(cell: Cell, slurm: dict[str, str] | None, run, stale_s: float, submitted: bool,
          gone: str | None = None) -> None:
    """Sets the cell's state and detail from its job's tag, SLURM's word and its claim's run;
    `gone`: why nothing of the sweep will start a cell (`sweep_gone`)."""
    state = cell.job.get("state")
    if cell.slurm and slurm is not None:
        cell.slurm_state = slurm.get(cell.slurm, "GONE")
    if state in DONE:
        cell.state = "done"
        cell.detail = f"{cell.duration_s:.0f} s" if cell.duration_s is not None else "already FINISHED: not run again"
        return
    if state == FAILED:
        cell.state, cell.detail = "failed", cell.job.get("error", "").splitlines()[0] if cell.job.get("error") else ""
        return
    if not submitted:
        cell.state, cell.detail = "submitting", "not yet handed to SLURM"
        return
    word = cell.slurm_state
    if word is not None and word not in claim.SLURM_ALIVE:
        cell.state = "killed"
        cell.detail = f"SLURM {word}: " + ("stopped by a signal" if state == KILLED else "ended without a word"
                                          if state else "never started")
        return
    if state is None and gone and not cell.slurm:
        cell.state, cell.detail = "left", f"never started ({gone})"
        return
    if state == "RUNNING" and (word is None or word == "RUNNING"):
        # a job killed outright before its claim, or whose run a status call has just ended KILLED
        worker = cell.job.get("worker", "")
        reason = claim.holder_gone(run, "", stale_s) if run is not None else claim.worker_gone(worker)
        started = time.time() - cell.job.get("start", time.time())
        if reason or (run is None and word is None and started > stale_s):
            cell.state, cell.detail = "killed", reason or f"no claimed run after {started:.0f} s"
            return
        cell.state = "running"
        if run is not None:
            beat = float(run.data.tags.get(claim.HEARTBEAT_TAG, run.info.start_time / 1000))
            cell.detail = f"heartbeat {time.time() - beat:.0f} s ago, {cell.job.get('worker')}"
        else:
            cell.detail = f"starting on {cell.job.get('worker')}"
        cell.detail += f" (SLURM {word})" if word else ""
        return
    if state == KILLED and word is None:
        # a SLURM task may be requeued: only squeue can say it will not run again
        cell.state, cell.detail, cell.certain = "killed", "stopped by a signal", cell.slurm is None
        if cell.slurm:
            cell.detail += " (no squeue on this host: a requeue cannot be told apart)"
        return
    if word == "COMPLETING":  # its processes are being ended: not yet known to be over
        cell.state, cell.detail = "running", "SLURM COMPLETING: ending"
        return
    cell.state = "running" if word == "RUNNING" else "waiting"
    cell.detail = (f"SLURM {word}" if word else "") + (" (requeued after a signal)" if state == KILLED else "")
