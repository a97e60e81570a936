"""`prunebench-status [SWEEP|latest]`: a sweep's cells as the store and SLURM know them, from any
host that reaches the store, with no process of the sweep's own needed (a detached sweep has none).

A status call also does what a job ending would: a claim whose worker is gone ends KILLED, and a
detached sweep whose every cell has ended is closed (its report written) here if no job did."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from statistics import mean

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from prunebench.tracking import cells, claim, store
from prunebench.tracking.sweep import DETACHED_TAG, STALE_TAG, SUBMITTED_TAG, close_if_done, end_gone_claims

STATES = ("done", "running", "failed", "waiting", "killed", "submitting", "left")


# exit status for a store, run or sweep that does not exist, as prunebench-compare's
NOT_FOUND = 3


class NotFound(LookupError):
    """A store, run id or `latest` that names no sweep; the message is the one line printed."""


def find_sweep(client: MlflowClient, experiment: str, sweep: str):
    """The parent run named by id, or the experiment's newest sweep for `latest`."""
    if sweep != "latest":
        try:
            run = client.get_run(sweep)
        except MlflowException:
            raise NotFound(f"no run {sweep!r} in {client.tracking_uri} (a sweep's parent run id, or latest)") from None
        if run.data.tags.get("prunebench.sweep") != "true":
            parent = run.data.tags.get("mlflow.parentRunId")
            raise NotFound(f"run {sweep} is a job, not a sweep's parent run" +
                           (f"; its sweep is {parent}" if parent else "") + " (prunebench-status takes a sweep, or latest)")
        return run
    found = client.get_experiment_by_name(experiment)
    runs = [] if found is None else client.search_runs(
        [found.experiment_id], "tags.`prunebench.sweep` = 'true'", order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise NotFound(f"no sweep in experiment {experiment!r} of {client.tracking_uri}")
    return runs[0]


def fill_accounting(found: list[cells.Cell]) -> None:
    """squeue forgets a task minutes after it ends; sacct (where accounting is on) still knows how."""
    gone = [c for c in found if c.slurm_state == "GONE"]
    accounted: dict[str, str] = {}
    for array in sorted({c.slurm.split("_")[0] for c in gone}):
        accounted |= claim.sacct_states(array)
    for cell in gone:
        cell.slurm_state = accounted.get(cell.slurm, "GONE")


def eta(found: list[cells.Cell]) -> str:
    """Cells left x the finished cells' mean duration, over the cells running at once (at least 1):
    a running cell counts as a whole cell left, so the estimate errs long."""
    durations = [c.duration_s for c in found if c.duration_s is not None]
    left = sum(c.state in ("running", "waiting", "submitting") for c in found)
    never = sum(c.state == "left" for c in found)
    if not left:
        return (f"{never} cell(s) never started: the same command again runs them (what is done is skipped)"
                if never else "nothing left")
    if not durations:
        return "ETA unknown (no cell finished yet)"
    at_once = max(1, sum(c.state == "running" for c in found))
    return (f"ETA ~{mean(durations) * left / at_once / 60:.1f} min ({left} cell(s) left, mean of "
            f"{len(durations)} finished: {mean(durations):.0f} s, {at_once} running at once)")


def format_status(parent, found: list[cells.Cell]) -> str:
    tags = parent.data.tags
    jobs = sorted({c.slurm.split("_")[0] for c in found if c.slurm})
    grid = [c.overrides.split() for c in found if c.overrides]
    shared = [o for o in grid[0] if all(o in g for g in grid)] if len(grid) > 1 else []
    lines = [f"sweep {parent.info.run_id}: {parent.info.status}"
             + (", detached" if tags.get(DETACHED_TAG) == "true" else "")
             + (", still being submitted" if tags.get(DETACHED_TAG) == "true" and tags.get(SUBMITTED_TAG) != "true"
                and parent.info.status == "RUNNING" else "")
             + (f", SLURM job {', '.join(jobs)}" if jobs else "") + f"; {tags.get('hydra.sweep_dir', '')}",
             f"every cell: {' '.join(shared) or tags.get('hydra.overrides', '')}",
             f"{'#':>4}  {'state':<10}  {'slurm':<10}  {'detail':<50}  overrides"]
    for cell in found:
        lines.append(f"{cell.num:>4}  {cell.state:<10}  {cell.slurm_state or '-':<10}  {cell.detail:<50}  "
                     + " ".join(o for o in cell.overrides.split() if o not in shared))
    counts = Counter(c.state for c in found)
    lines.append(f"{len(found)} cell(s): " + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s])
                 + f"; {eta(found)}")
    if parent.info.status != "RUNNING":
        ended = {k.removeprefix("prunebench.jobs_"): v for k, v in tags.items() if k.startswith("prunebench.jobs_")}
        lines.append(f"closed {parent.info.status} ({', '.join(f'{v} {k}' for k, v in ended.items())}) by "
                     f"{parent.data.params.get('prunebench.closed_by', 'the submitting process')}; "
                     f"report under report/ in run {parent.info.run_id}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prunebench-status", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", nargs="?", default="latest", help="the sweep's parent run id, or latest (default)")
    parser.add_argument("--uri", default=None, help="the MLflow store (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    parser.add_argument("--experiment", default="prunebench", help="where `latest` looks (default prunebench)")
    parser.add_argument("--stale-s", type=float, default=None,
                        help="heartbeat age after which a claim off SLURM is dead (default: the sweep's tracking.claim.stale_s)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    uri = store.tracking_uri(args.uri)
    try:
        if (missing := store.missing_store(uri)) is not None:
            raise NotFound(missing)
        client = MlflowClient(uri)
        parent = find_sweep(client, args.experiment, args.sweep)
    except NotFound as err:
        print(f"prunebench-status: {err}", file=sys.stderr)
        return NOT_FOUND
    run_id = parent.info.run_id
    stale_s = args.stale_s if args.stale_s is not None else float(parent.data.tags.get(STALE_TAG, 300))
    if parent.info.status == "RUNNING":
        end_gone_claims(client, run_id, parent.info.experiment_id, stale_s)
        if close_if_done(uri, run_id, stale_s):
            print(f"every cell of sweep {run_id} has ended: closed it here", flush=True)
    found = cells.read_cells(client, run_id, stale_s)
    fill_accounting(found)
    print(format_status(client.get_run(run_id), found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
