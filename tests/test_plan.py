"""`prunebench-plan`'s time per job: the median duration of the store's finished runs of the job's
setting, never a number the code assumes; "unknown" where the store has none."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from conftest import TINY_MC, compose_cfg, planned_sweep
from prunebench import job
from prunebench.plan import format_plan, readable

BASE = [*TINY_MC, "tracking.ensure_dense=false"]


def test_a_left_job_is_timed_by_the_finished_runs_of_its_setting(store):
    job.run(compose_cfg([*BASE, "pruner=magnitude", "sparsity=0.1"]))
    client = MlflowClient(store)
    (stored,) = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id])
    seconds = (stored.info.end_time - stored.info.start_time) / 1000
    jobs = planned_sweep(BASE, ["pruner=magnitude,random", "sparsity=0.1,0.2", "limit=null,2"])
    by = {" ".join(o for o in j.overrides if o.split("=")[0] in ("pruner", "sparsity", "limit")): j for j in jobs}
    assert by["pruner=magnitude sparsity=0.1 limit=null"].status == "done"
    assert by["pruner=magnitude sparsity=0.1 limit=null"].estimate == ""  # done: nothing to time
    # the same model, task, pruner and limit at another ratio: timed by the run that finished
    assert by["pruner=magnitude sparsity=0.2 limit=null"].durations == [seconds]
    assert by["pruner=magnitude sparsity=0.2 limit=null"].estimate == f"~{readable(seconds)} (1 run)"
    # another pruner, or another limit: the store says nothing of them
    for other in ("pruner=random sparsity=0.2 limit=null", "pruner=magnitude sparsity=0.2 limit=2"):
        assert by[other].estimate == "unknown", other
    printed = format_plan(jobs)
    assert f"~{readable(seconds)} for 1 of the 7 left jobs, one at a time, 6 unknown" in printed, printed


def test_a_store_without_finished_runs_times_nothing(fresh_store):
    jobs = planned_sweep(BASE, ["pruner=magnitude", "sparsity=0.1,0.2"])
    assert [j.estimate for j in jobs] == ["unknown", "unknown"]
    assert "none of the left jobs has one" in format_plan(jobs)


def test_readable_durations():
    assert [readable(s) for s in (42, 89.4, 600, 5399, 7200)] == ["42 s", "89 s", "10 min", "90 min", "2.0 h"]
