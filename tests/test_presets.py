"""Paper presets: each composes and validates job by job with tiny models and self-written data
standing in for the real ones, its grid has the size the README states, and the plan reads the
store without writing to it. Their jobs run in test_preset_jobs.py: a module of its own, so that
`make test`'s workers take the plans and the jobs side by side (--dist loadfile)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from chat_server import ChatServer, benchmark_judge
from conftest import FIXTURES, compose_cfg
from prunebench import job
from prunebench.paths import CONF_DIR
from prunebench.plan import DENSE, fixed_overrides, format_plan, job_composer, main, plan, sweep_jobs
from prunebench.tracking.sweep import SweepRunCallback
from test_classification import glue_tsv
from test_vision import cifar100, fashion_mnist, food101, image_folder
from vlm_fixtures import SUITE_TASKS, write_vlm_data

# grid jobs, dense baselines: the README's "Paper presets" table states these
GRIDS = {"mop_llama2": (25, 1), "mop_llama3": (15, 1), "hies_bert_glue": (120, 8), "hies_llama2": (30, 1),
         "hies_vit": (60, 4), "dynmoe_olmoe": (5, 1), "mop_llava": (15, 1), "hies_llava": (15, 1), "owl": (12, 1),
         "reap": (8, 1), "dsnot": (18, 1), "structured_baselines": (18, 1), "calibration": (18, 1),
         "recovery": (18, 1), "llm_pruner_recovery": (4, 1), "instruct": (12, 2)}
QUICK = ["trainer=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "limit=2"]
LATENCY = ["bench.warmup=1", "bench.runs=1", "bench.new_tokens=4"]


@pytest.fixture(scope="module")
def judge():
    """The LLaVA presets' judge: a chat-completions server on 127.0.0.1 with the benchmarks' reply formats."""
    with ChatServer(benchmark_judge) as server:
        yield server.url


@pytest.fixture(scope="module")
def data(tmp_path_factory, judge):
    """One data_dir in ../shared/data's layout (the benchmark fixtures, GLUE, WikiText-2, two BBH
    subtasks), an alpaca file, image trees for the vision preset and a stand-in checkpoint path; the
    vision-language benchmarks' files with stand-in images and the judge's URL for the LLaVA presets."""
    root = tmp_path_factory.mktemp("data")
    for folder in (FIXTURES / "benchmarks").iterdir():
        (root / folder.name).symlink_to(folder)
    (root / "bbh").symlink_to(FIXTURES / "bbh" / "bbh")
    (root / "wikitext2").mkdir()
    (root / "wikitext2" / "wiki.train.raw").write_text(" = Heading = \n the quick brown fox jumps over it . \n" * 60)
    for task, folder in (("sst2", "SST-2"), ("cola", "CoLA"), ("mrpc", "MRPC"), ("qqp", "QQP"), ("stsb", "STS-B"),
                         ("qnli", "QNLI"), ("rte", "RTE"), ("mnli", "MNLI")):
        (root / "glue" / folder).mkdir(parents=True)
        for seed, name in enumerate(["dev_matched", "dev_mismatched", "train"] if task == "mnli" else ["dev", "train"]):
            (root / "glue" / folder / f"{name}.tsv").write_text(glue_tsv(task, 12 if name != "train" else 20, seed))
    alpaca = root / "alpaca.json"
    alpaca.write_text(json.dumps([{"instruction": f"Say {w}.", "input": "x" * (i % 2), "output": w}
                                  for i, w in enumerate("one two three four five six".split())]))
    vision = {"imagenet1k": (image_folder(root / "in_val"), image_folder(root / "in_train")),
              "cifar100": (cifar100(root / "c100"),), "food101": (food101(root / "f101"),),
              "fashion_mnist": (fashion_mnist(root / "fm"),)}
    vlm_root, images = write_vlm_data(tmp_path_factory.mktemp("vlm"))
    return root, alpaca, vision, (vlm_root, images, judge)


def tiny(name: str, data) -> list[str]:
    """The overrides that put tiny models and local files in place of a preset's real ones."""
    root, alpaca, vision, (vlm_root, images, judge) = data
    common = [f"data_dir={root}", *QUICK]
    if name.endswith("_llava"):  # the fixtures' ScienceQA questions stand in for its train split
        tasks = ("vizwiz_vqa", "mm_vet") if name == "hies_llava" else SUITE_TASKS
        # four new tokens an answer: what is scored (the judge's replies, the submission file) needs no more
        vlm = [f"data_dir={vlm_root}", *QUICK, "model=tiny-llava", f"judge.url={judge}", "judge.model=test-judge",
               "judge.api_key_env=null", *(f"task.tasks.{t}.image_dir={images}" for t in tasks),
               *(f"task.tasks.{t}.max_gen_toks=4" for t in tasks)]
        if name == "hies_llava":
            return [*vlm, "calib.n_samples=2"]
        return [*vlm, "model.text_config.num_hidden_layers=6", "calib.n_samples=2", "calib.task.image_dir=" + str(images),
                f"calib.task.source.path={vlm_root / 'scienceqa' / 'llava_test_CQM-A.json'}", "calib.allow_eval_split=true"]
    if name.startswith("mop"):  # six blocks: MoP's L steps keep the last two
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", f"calib.path={alpaca}",
                "calib.n_samples=3", *LATENCY]
    if name == "instruct":  # a model with a chat template (read from its GGUF, not loaded); MMLU is no fixture
        return [*common, "model=smollm2-135m", "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true",
                "task.lm_eval=[]"]
    if name == "hies_bert_glue":
        return [*common, "model=tiny-bert-cls", "calib.n_samples=4"]
    if name == "hies_llama2":
        return [*common, "model=tiny-llama", "calib.n_samples=2", "calib.seq_len=16"]
    if name == "reap":  # WikiText-2 windows stand in for C4, the local questions for lm-eval's tasks
        return [*common, "model=tiny-qwen3-moe", "calib=wikitext2", "calib.n_samples=2", "calib.seq_len=16",
                "task=local_mc", f"task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}"]
    if name in ("owl", "dsnot"):  # WikiText-2 train stands in for C4 and for the test split the fixture lacks
        return [*common, "model=tiny-llama", "model.config.max_position_embeddings=2048", "calib=wikitext2",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32"]
    if name == "calibration":  # the fixture's WikiText-2 train windows; its hellaswag file in lm-eval's layout
        return [*common, "model=tiny-llama", "model.config.max_position_embeddings=2048", "calib.seq_len=16",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32",
                "calib.allow_eval_split=true"]
    if name == "structured_baselines":  # six blocks: SLEB keeps its first and last; WikiText-2 train as above
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", "model.config.max_position_embeddings=2048",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32", *LATENCY]
    if name in ("recovery", "llm_pruner_recovery"):  # six blocks for LLM-Pruner's range; one quick recovery step
        quick = ["recovery.seq_len=16", "recovery.batch_size=2", "recovery.micro_batch_size=2", "recovery.val_samples=2",
                 "recovery.max_steps=1", "recovery.warmup_steps=0"]
        if name == "llm_pruner_recovery":  # alpaca-cleaned is on the hub
            quick += ["recovery.data=file", f"recovery.path={alpaca}", "recovery.seq_len=512"]
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", "model.config.max_position_embeddings=2048",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true", *quick,
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32"]
    if name == "hies_vit":
        paths = [f"vision_data.imagenet1k.eval={vision['imagenet1k'][0]}",
                 f"vision_data.imagenet1k.train={vision['imagenet1k'][1]}"]
        for ds in ("cifar100", "food101", "fashion_mnist"):  # validation reads no checkpoint: any path will do
            paths += [f"vision_data.{ds}.eval={vision[ds][0]}", f"vision_data.{ds}.train={vision['imagenet1k'][1]}",
                      f"vision_data.{ds}.checkpoint={alpaca}"]
        return [*common, "model=tiny-vit", "calib.n_samples=4", "bench.warmup=1", "bench.runs=1",
                "bench.throughput_batch=2", *paths]
    arc_dev = FIXTURES / "benchmarks" / "arc" / "ARC-Easy-Test.jsonl"  # ARC-e's OpenCompass version reads dev
    return [*common, "model=tiny-olmoe", "limit=1", f"task.protocols.opencompass.arc_easy.source.path={arc_dev}",
            "task.tasks.bbh_cot_fewshot.subtasks=[boolean_expressions,date_understanding]",
            "task.tasks.bbh_cot_fewshot.max_gen_toks=8"]


def preset_plan(name: str, extra: list[str]):
    arguments = [f"experiment={name}", *extra]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        base = compose("config", overrides=fixed_overrides(arguments), return_hydra_config=True)
        params = OmegaConf.to_container(base.hydra.sweeper.params)
        return plan(arguments, params, job_composer("config"))


def test_a_plan_composes_each_job_as_hydra_composes_it(data):
    """The plan builds the defaults tree once per set of group choices and applies the values to a
    copy: every job must equal Hydra's own compose of its overrides, whatever kinds they mix."""
    extra = [*tiny("hies_bert_glue", data), "+pruner.extra=1", "task.tasks={}", "pruner.scope=layer"]
    jobs = sweep_jobs({"finetuned": "bert-base-sst2,bert-base-rte", "pruner": "heads_l2,hies_paper",
                       "sparsity": "0.1,0.3"}, ["experiment=hies_bert_glue", *extra])
    jobs += [["model=tiny-llama", "limit=3", "hydra.job.chdir=true"], ["model=tiny-llama", "calib=c4", "limit=4"]]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        compose_job = job_composer("config")
        for overrides in jobs:
            expected = OmegaConf.to_container(compose("config", overrides=overrides))
            assert OmegaConf.to_container(compose_job(overrides)) == expected, overrides
            assert OmegaConf.to_container(compose_job(overrides)) == expected, overrides  # from its cached tree


def test_a_config_file_changed_between_composes_is_read_again(tmp_path):
    """The composer parses each file once while its size and modification time stay."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    with initialize_config_dir(str(conf), version_base="1.3"):
        compose_job = job_composer("config")
        assert compose_job(["model=tiny-llama"]).model.config.num_hidden_layers == 2
        tiny = conf / "model" / "tiny-llama.yaml"
        tiny.write_text(tiny.read_text().replace("num_hidden_layers: 2", "num_hidden_layers: 12"))
        composed = compose_job(["model=tiny-llama", "task=local_mc"])  # a new set of choices: a new tree
        assert composed.model.config.num_hidden_layers == 12
        assert OmegaConf.to_container(composed) == OmegaConf.to_container(
            compose("config", overrides=["model=tiny-llama", "task=local_mc"]))


def test_every_preset_option_is_a_preset_with_a_grid():
    presets = sorted(p.stem for p in (FIXTURES.parents[1] / "conf" / "experiment").glob("*.yaml"))
    assert presets == sorted(GRIDS)


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_preset_grid_composes_and_validates_with_tiny_models(name, data, fresh_store):
    jobs = preset_plan(name, tiny(name, data))
    grid = [j for j in jobs if j.overrides[0] != DENSE]
    assert [j.note for j in jobs if j.status == "invalid"] == []
    assert (len(grid), len(jobs) - len(grid)) == GRIDS[name]
    assert {j.status for j in jobs} == {"left"}
    assert not Path(fresh_store.removeprefix("sqlite:///")).exists()  # validated without touching the store


def test_plan_counts_finished_runs_and_writes_nothing(store, capsys):
    overrides = ["experiment=hies_llama2", "model=tiny-llama", "task=local_mc",
                 f"task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}", *QUICK]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        job.run(compose("config", overrides=[*overrides, "pruner=heads_random", "sparsity=0.1"]))  # + its dense run
    before = mlflow.search_runs(experiment_names=["prunebench"])
    assert main(overrides) == 0
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
    jobs = plan(["pruner=none,magnitude", "sparsity=0,1.5,0.3", "model=tiny-llama"], {}, compose_cfg)
    assert [j.status for j in jobs] == ["left", "invalid", "repeat", "repeat", "invalid", "left"]
    assert "sparsity=1.5 is outside [0, 1)" in jobs[1].note and jobs[3].note == "same run key as #0"
    assert "6 grid jobs + 0 dense baseline(s): 0 done, 2 left, 2 invalid, 2 repeated" in format_plan(jobs)
