"""`prunebench-plan`'s time per job: the median duration of the store's finished runs of the job's
setting; else its evaluation's positions (counted by the job's own engine on its tokenizer, no
weights) at the speed of the store's finished runs of its model, or at this machine's matmul rate
(a lower bound); "unknown", with the reason, where none of it is at hand. Never a number the code
assumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import FIXTURES, TINY_MC, compose_cfg, planned_sweep
from prunebench import job
from prunebench.models import tiny
from prunebench.plan import format_plan, readable

BASE = [*TINY_MC, "tracking.ensure_dense=false"]
ARTICLE = " = Valkyria Chronicles III = \n Senjō no Valkyria 3 is a tactical role @-@ playing video game . \n" * 20


def stored_run(store: str):
    client = MlflowClient(store)
    (stored,) = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id])
    return stored


def by_setting(jobs) -> dict:
    return {" ".join(o for o in j.overrides if o.split("=")[0] in ("pruner", "sparsity", "limit")): j for j in jobs}


def test_a_left_job_is_timed_by_the_finished_runs_of_its_setting_else_by_their_speed(store):
    job.run(compose_cfg([*BASE, "pruner=magnitude", "sparsity=0.1"]))
    stored = stored_run(store)
    seconds = (stored.info.end_time - stored.info.start_time) / 1000
    speed = stored.data.metrics["time/eval_positions"] / stored.data.metrics["time/eval_s"]
    jobs = planned_sweep(BASE, ["pruner=magnitude,random", "sparsity=0.1,0.2", "limit=null,2"])
    by = by_setting(jobs)
    assert by["pruner=magnitude sparsity=0.1 limit=null"].status == "done"
    assert by["pruner=magnitude sparsity=0.1 limit=null"].estimate == ""  # done: nothing to time
    # the same model, task, pruner and limit at another ratio: timed by the run that finished
    assert by["pruner=magnitude sparsity=0.2 limit=null"].durations == [seconds]
    assert by["pruner=magnitude sparsity=0.2 limit=null"].estimate == f"~{readable(seconds)} (1 run)"
    # another pruner, or another limit, never run: its evaluation at the speed the model ran at
    for other in ("pruner=random sparsity=0.2 limit=null", "pruner=magnitude sparsity=0.2 limit=2"):
        timed = by[other].evaluation
        assert timed.seconds == pytest.approx(timed.positions / speed), other
        assert by[other].estimate == f"~{readable(timed.seconds)} eval (1 run's speed)", other
    # the same task at another pruner: the same positions as the stored run's, cut short by a limit
    assert by["pruner=random sparsity=0.2 limit=null"].evaluation.positions == stored.data.metrics["time/eval_positions"]
    assert by["pruner=magnitude sparsity=0.2 limit=2"].evaluation.positions < stored.data.metrics["time/eval_positions"]
    printed = format_plan(jobs)
    assert "time of the 7 left jobs, one at a time, by kind:" in printed, printed
    assert f"  ~{readable(seconds)} for 1 job, whole job: the median duration" in printed, printed
    evals = sum(j.evaluation.seconds for j in jobs if j.evaluation)
    assert f"  ~{readable(evals)} for 6 jobs, evaluation only (no pruning, recovery or latency)" in printed, printed
    assert "unknown" not in printed, printed


@pytest.mark.parametrize("task", [
    [*TINY_MC[1:3], "limit=3"],  # loglikelihood: each document's EncodedDoc.tokens
    # perplexity: windows x their length
    ["task=wikitext2_ppl", "task.tasks.wikitext2_ppl.seq_len=32", "limit=5", "++data_dir={tmp}"],
    # generation: each prompt and its max_gen_toks
    ["task=bbh_zeroshot", "task.tasks.bbh_zeroshot.subtasks=[boolean_expressions,date_understanding]",
     "task.tasks.bbh_zeroshot.max_gen_toks=8", "limit=2", f"++data_dir={FIXTURES / 'bbh'}"],
], ids=["loglikelihood", "perplexity", "generation"])
def test_the_plan_counts_the_positions_the_job_runs(store, tmp_path, monkeypatch, task):
    """A never-run setting's count, from the tokenizer alone, equals what the job logs having run
    (`time/eval_positions`, its progress bar's count), exactly."""
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    for split in ("train", "test"):
        (tmp_path / "wikitext2" / f"wiki.{split}.raw").write_text(ARTICLE)
    base = ["model=tiny-llama", *(o.format(tmp=tmp_path) for o in task), "trainer.enable_progress_bar=false",
            "tracking.ensure_dense=false"]
    job.run(compose_cfg([*base, "pruner=magnitude", "sparsity=0.1"]))
    logged = stored_run(store).data.metrics["time/eval_positions"]
    (planned,) = planned_sweep(base, ["pruner=random", "sparsity=0.2"])
    assert planned.evaluation.positions == logged > 0
    assert planned.estimate.endswith(" eval (1 run's speed)")


def test_an_empty_store_gives_the_matmul_lower_bound_and_creates_nothing(fresh_store, monkeypatch):
    def no_weights(**kwargs):
        raise AssertionError("the plan loaded the model")

    no_weights.stated_model = tiny.stated_tiny  # what the plan may read: the tokenizer and config
    monkeypatch.setattr(tiny, "load_tiny", no_weights)
    jobs = planned_sweep(BASE, ["pruner=magnitude", "sparsity=0.1,0.2"])
    assert [j.evaluation.basis for j in jobs] == ["matmul", "matmul"]
    assert all(j.estimate.startswith(">=") and j.estimate.endswith(" eval (matmul)") for j in jobs)
    assert jobs[0].evaluation.positions == jobs[1].evaluation.positions > 0
    printed = format_plan(jobs)
    assert "for 2 jobs, evaluation only, a lower bound: its positions x 2 x the model's parameters" in printed, printed
    assert not Path(fresh_store.removeprefix("sqlite:///")).exists()  # the store is only read


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: model.device=cuda is present")
def test_a_job_on_a_device_not_here_is_unknown_with_the_reason(fresh_store):
    (planned,) = planned_sweep([*BASE, "model.device=cuda"], ["pruner=magnitude", "sparsity=0.1"])
    assert planned.estimate == "unknown"
    assert "time unknown: model.device=cuda is not on this machine" in planned.note
    assert "time: none of the 1 left jobs has one (see each job's note)" in format_plan([planned])


def test_a_hub_id_not_cached_is_unknown_with_the_reason_and_asks_no_network(fresh_store, monkeypatch):
    import socket

    asked = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: asked.append(address))
    (planned,) = planned_sweep([*BASE, "model=hf_causal", "model.path=prunebench-tests/never-cached"],
                               ["pruner=magnitude", "sparsity=0.1"])
    assert planned.estimate == "unknown"
    assert ("time unknown: prunebench-tests/never-cached: its tokenizer or config is not in the local Hugging Face "
            "cache") in planned.note
    assert asked == []


def test_readable_durations():
    assert [readable(s) for s in (0.00009, 0.0123, 4.56, 42, 89.4, 600, 5399, 7200)] == [
        "0 s", "0.012 s", "4.6 s", "42 s", "89 s", "10 min", "90 min", "2.0 h"]


def test_a_task_two_chat_formats_share_is_counted_in_each(fresh_store, tmp_path):
    """A plan builds an lm-eval task once for its jobs (its definition's state, shared): a job of raw
    prompts after one of the chat template counts raw prompts, as it does alone."""
    from helpers.instruct import save_instruct_model

    base = ["model=hf_causal", f"model.path={save_instruct_model(tmp_path / 'instruct')}", "task=lm_eval",
            "task.lm_eval=[boolq]", "limit=2", "tracking.ensure_dense=false", "pruner=magnitude", "sparsity=0.1"]
    chat, raw = planned_sweep(base, ["eval.chat_template=true,false"])
    (alone,) = planned_sweep(base, ["eval.chat_template=false"])
    assert raw.evaluation.positions == alone.evaluation.positions < chat.evaluation.positions
