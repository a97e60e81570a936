"""LLaVA-Bench and MM-Vet on the real question files (with stand-in images and the files shared/data
lacks written in their schema), the judge prompts they send, and a run on tiny-llava graded by a real
chat-completions server, an unparseable reply among them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest

from helpers.chat_server import ChatServer, benchmark_judge, user_text
from conftest import SHARED_DATA, compose_cfg, stand_in_images
from prunebench import job
from prunebench.api.errors import ConfigError
from prunebench.tasks.build import build_tasks
from helpers.vlm_fixtures import write_vlm_data

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "pruner=none"]
COCO = SHARED_DATA / "llava-bench-coco"
MM_VET = SHARED_DATA / "mm-vet" / "llava-mm-vet.jsonl"


def judge_overrides(url: str) -> list[str]:
    return ["judge=openai_compatible", f"judge.url={url}", "judge.model=test-judge", "judge.api_key_env=null"]


@pytest.fixture(autouse=True)
def judge_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.shared_data
@pytest.mark.skipif(not MM_VET.exists(), reason="needs ../shared/data/mm-vet")
def test_the_real_mm_vet_file_parses_with_lmms_eval_prompts(tmp_path):
    questions = lines(MM_VET)
    stand_in_images(tmp_path / "images", sorted({q["image"] for q in questions}))
    # mm-vet.json is not in shared/data: a stand-in in its schema, one entry per question
    (tmp_path / "mm-vet.json").write_text(json.dumps({f"v1_{q['question_id']}": {
        "question": q["text"], "answer": "x", "capability": ["rec"], "imagename": q["image"]} for q in questions}))
    cfg = compose_cfg(["model=tiny-llava", "task=mm_vet", f"data_dir={SHARED_DATA}", *judge_overrides("http://127.0.0.1:9/v1"),
                       f"task.tasks.mm_vet.references.path={tmp_path / 'mm-vet.json'}",
                       f"task.tasks.mm_vet.image_dir={tmp_path / 'images'}"])
    requests = build_tasks(cfg)["mm_vet"].instances()
    assert len(requests) == 218
    # lmms-eval's mmvet doc_to_text with the pre-2024-04 (and LLaVA's) empty pre_prompt: the question itself
    assert [r.prompt for r in requests[:3]] == ["What is x in the equation?", "What is d in the last equation?",
                                                "What is x in the equation?"]
    assert requests[1].requests[0].images == (tmp_path / "images" / "v1_1.png",)
    # lmms-eval's current default pre_prompt, as the task's description
    cfg.task.tasks.mm_vet.description = ("First please perform reasoning, and think step by step to provide best "
                                         "answer to the following question: \n\n")
    assert build_tasks(cfg)["mm_vet"].instances(1)[0].prompt == (
        "First please perform reasoning, and think step by step to provide best answer to the following question: "
        "\n\nWhat is x in the equation?")


@pytest.mark.shared_data
@pytest.mark.skipif(not COCO.exists(), reason="needs ../shared/data/llava-bench-coco")
def test_the_real_llava_bench_coco_files_parse_with_lmms_eval_prompts(tmp_path):
    questions = lines(COCO / "qa90_questions.jsonl")
    names = sorted({q["image"] for q in questions})
    stand_in_images(tmp_path / "images", names)
    # LLaVA's caps_boxes_coco2014_val_80.jsonl is not in shared/data: a stand-in in its schema
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps({"image": n, "captions": ["A photo."], "instances": []}) + "\n"
                                                 for n in names))
    cfg = compose_cfg(["model=tiny-llava", "task=llava_bench_coco", f"data_dir={SHARED_DATA}",
                       *judge_overrides("http://127.0.0.1:9/v1"), f"task.tasks.llava_bench_coco.context.path={tmp_path / 'caps.jsonl'}",
                       f"task.tasks.llava_bench_coco.image_dir={tmp_path / 'images'}"])
    task = build_tasks(cfg)["llava_bench_coco"]
    requests = task.instances()
    assert len(requests) == 90 and len(names) == 30
    # lmms-eval's llava_doc_to_text with empty pre/post prompts: the question
    assert [r.prompt for r in requests[:3]] == ["What is the color of the two suitcases in the image?",
                                                "Analyze the image in a comprehensive and detailed manner.",
                                                "What potential factors could make these suitcases valuable?"]
    # the GPT-4 reference answers joined by question_id
    assert requests[0].target == "The colors of the two suitcases in the image are black and brown with yellow details."
    assert {r.doc["category"] for r in requests} == {"conv", "detail", "complex"}


def test_a_judged_task_without_a_judge_fails_validation_saying_how_to_set_one(tmp_path):
    data, images = write_vlm_data(tmp_path / "data")
    cfg = compose_cfg(["model=tiny-llava", "task=mm_vet", f"data_dir={data}", f"task.tasks.mm_vet.image_dir={images}"])
    with pytest.raises(ConfigError, match=r"task mm_vet .*graded by a judge model and none is set: add "
                                          r"judge=openai_compatible judge.model=.* or judge=hf_causal judge.path="):
        build_tasks(cfg)


def test_the_judge_prompts_are_the_benchmarks_own(tmp_path):
    data, images = write_vlm_data(tmp_path / "data")
    overrides = ["model=tiny-llava", f"data_dir={data}", *judge_overrides("http://127.0.0.1:9/v1")]
    coco = build_tasks(compose_cfg([*overrides, "task=llava_bench_coco", f"task.tasks.llava_bench_coco.image_dir={images}"]))
    wild = build_tasks(compose_cfg([*overrides, "task=llava_bench_wild", f"task.tasks.llava_bench_wild.image_dir={images}"]))
    from prunebench.tasks.llava_bench import COCO_RULE, WILD_RULE, review_prompt
    from prunebench.tasks.mm_vet import grader_prompt

    # eval_gpt_review_visual.py's content for COCO: captions, a blank line, the boxes
    assert review_prompt(coco["llava_bench_coco"].docs()[0]["context"], "Q?", "Ref.", "Ans.", COCO_RULE) == (
        "[Context]\nCaption 0a.\nCaption 0b.\n\ncat: [0.1, 0.2, 0.5, 0.9]\n\n[Question]\nQ?\n\n[Assistant 1]\nRef.\n\n"
        "[End of Assistant 1]\n\n[Assistant 2]\nAns.\n\n[End of Assistant 2]\n\n[System]\n" + COCO_RULE + "\n\n")
    assert wild["llava_bench_wild"].docs()[0]["context"] == "A scene 1."
    assert COCO_RULE.startswith("We would like to request your feedback on the performance of two AI assistants")
    assert "represented with five descriptive sentences" in COCO_RULE and "a few sentences describing the image. \n" in WILD_RULE
    # MM-Vet's grader: the few-shot table, then "question | answer with spaced <AND>/<OR> | prediction | "
    prompt = grader_prompt("What is x?", "-1<AND>-5", "x = 3")
    assert prompt.endswith("| 1.0\n\nWhat is x? | -1 <AND> -5 | x = 3 | ")
    assert prompt.startswith("Compare the ground truth and prediction from AI models, to give a correctness score")
    # mm-vet_evaluator.py's own text: a blank line, then its header (lmms-eval's copy has neither)
    assert ("Just complete the last space of the correctness score.\n\nQuestion | Ground truth | Prediction | "
            "Correctness\n--- | --- | --- | ---\nWhat is x in the equation? | -1 <AND> -5 | x = 3 | 0.0\n") in prompt


def test_judged_tasks_run_on_tiny_llava_with_an_unparseable_reply_recorded(tmp_path, store):
    data, images = write_vlm_data(tmp_path / "data")

    def script(body, auth):
        # the first LLaVA-Bench question's review and every MM-Vet try of question 2 have no score
        text = user_text(body)
        if "[Question]\nQuestion 0?" in text or (text.startswith("Compare") and "What is 2? |" in text):
            return 200, "I cannot tell."
        return benchmark_judge(body, auth)

    with ChatServer(script) as server:
        for name in ("llava_bench_coco", "mm_vet"):
            metrics = job.run(compose_cfg(["model=tiny-llava", f"task={name}", f"data_dir={data}", *QUIET,
                                           *judge_overrides(server.url), f"task.tasks.{name}.image_dir={images}",
                                           f"task.tasks.{name}.max_gen_toks=8"]))
            run = mlflow.search_runs(search_all_experiments=True, output_format="list", order_by=["start_time DESC"])[0]
            assert run.info.status == "FINISHED"
            assert run.data.tags["prunebench.judge"] == "test-judge" and f"prunebench.judge_prompt.{name}" in run.data.tags
            assert metrics[f"{name}/judge_unparsed"] == 1 and metrics[f"{name}/judge_cache_hits"] == 0
            # 1 of 6 gradings unreadable is over the default 5%: the number is logged, but no headline
            assert metrics[f"{name}/judge_grades"] == 6 and metrics[f"{name}/judge_failure_rate"] == pytest.approx(1 / 6)
            assert "avg/score" not in metrics and "avg/score" not in run.data.metrics
            assert json.loads(run.data.tags["prunebench.avg_metrics"]) == {}
            assert json.loads(run.data.tags["prunebench.withheld"]) == {name: (
                "judge failure rate 0.167 (1 of 6 gradings unreadable) exceeds judge.max_failure_rate=0.05")}
            path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=f"predictions/{name}.jsonl")
            records = [json.loads(line) for line in open(path)]
            assert len(records) == 6 and all(r["judge_reply"] for r in records)
            if name == "llava_bench_coco":
                # LLaVA keeps an unread review as [-1, -1] in the means: 5 x (8, 6) and one (-1, -1)
                assert [r["scores"] for r in records if not r["judge_parsed"]] == [[-1.0, -1.0]]
                assert metrics["llava_bench_coco/gpt_eval_llava_all"] == pytest.approx((5 * 6 - 1) / (5 * 8 - 1) * 100)
                assert metrics["llava_bench_coco/gpt_eval_llava_detail"] == pytest.approx(75.0)
                assert metrics["llava_bench_coco/judge_requests"] == 6
                reviews = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                              artifact_path="judge/review_llava_bench_coco.jsonl")
                assert [r["tuple"] for r in lines(Path(reviews))][:2] == [[-1.0, -1.0], [8.0, 6.0]]
            else:
                # MM-Vet: question 2 tried five times then scored 0.0; the others 0.5 at the first try
                failed = next(r for r in records if not r["judge_parsed"])
                assert failed["score"] == 0.0 and len(failed["judge_replies"]) == 5
                assert metrics["mm_vet/judge_requests"] == 5 + 5
                assert metrics["mm_vet/gpt_eval_score"] == pytest.approx(5 * 0.5 / 6 * 100)
                assert metrics["mm_vet/math"] == pytest.approx(0.5 * 2 / 3 * 100)  # questions 0, 2 (failed), 4
                assert metrics["mm_vet/rec"] == pytest.approx(50.0)
        retries = [b for b in server.requests if "What is 2? |" in user_text(b)]
        assert [b["temperature"] for b in retries] == [0.0, 0.0, 0.5, 1.0, 1.5]
        assert user_text(retries[1]).endswith("\nPredict the correctness of the answer (digit): ")
    # the reports leave both out of their tables and say why, under them
    from prunebench.report.build import write_report

    out = write_report("prunebench", None, tmp_path / "report", layout="paper")
    for page in ("results.md", "paper.md"):
        text = (out / page).read_text()
        assert "No headline number (left out of the tables, avg/score and stability):" in text
        for name in ("llava_bench_coco", "mm_vet"):
            assert (f"- {name}, tiny-llava | none | 0.0 (run " in text
                    and "judge failure rate 0.167 (1 of 6 gradings unreadable) exceeds judge.max_failure_rate=0.05" in text)
        assert "gpt_eval" not in text.split("No headline number")[0]  # no column of a withheld task


def test_judge_repeats_grade_each_answer_again_with_a_cache_entry_per_repeat(tmp_path, store):
    """LLaVA-Bench graded twice by a judge that scores (8, 6) the first time it sees a review and
    (8, 4) the second: the score is the mean of 75 and 50 and the spread their std; a second run reads
    each repeat's own grade back from the cache. With max_failure_rate above 1 of 12 the headline stays."""
    data, images = write_vlm_data(tmp_path / "data")
    seen = {}

    def script(body, auth):
        text = user_text(body)
        seen[text] = seen.get(text, 0) + 1
        if seen[text] == 1:
            return 200, "8 6\nfine"
        return 200, "I cannot tell." if "[Question]\nQuestion 0?" in text else "8 4\nless so"

    name = "llava_bench_coco"
    overrides = ["model=tiny-llava", f"task={name}", f"data_dir={data}", *QUIET, f"task.tasks.{name}.image_dir={images}",
                 f"task.tasks.{name}.max_gen_toks=8", "judge.repeats=2", "judge.max_failure_rate=0.1"]
    with ChatServer(script) as server:
        metrics = job.run(compose_cfg([*overrides, *judge_overrides(server.url)]))
        assert len(server.requests) == 12  # 6 answers x 2 repeats: no repeat read the first grading back
        run = mlflow.search_runs(search_all_experiments=True, output_format="list", order_by=["start_time DESC"])[0]
        # repeat 0: 5 x (8, 6) and question 0's (8, 6); repeat 1: 5 x (8, 4) and question 0 unread (-1, -1)
        first, second = 6 / 8 * 100, (5 * 4 - 1) / (5 * 8 - 1) * 100
        assert metrics[f"{name}/gpt_eval_llava_all"] == pytest.approx((first + second) / 2)
        assert metrics[f"{name}/gpt_eval_llava_all_repeat_std"] == pytest.approx(abs(first - second) / 2)  # ddof 0
        assert metrics[f"{name}/judge_grades"] == 12 and metrics[f"{name}/judge_unparsed"] == 1
        assert metrics[f"{name}/judge_failure_rate"] == pytest.approx(1 / 12)
        assert metrics["avg/score"] == metrics[f"{name}/gpt_eval_llava_all"]  # 1/12 is within 0.1
        assert "prunebench.withheld" not in run.data.tags
        path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=f"predictions/{name}.jsonl")
        records = [json.loads(line) for line in open(path)]
        assert [r["scores"] for r in records] == [[8.0, 6.0]] * 6
        assert {r["prompt"]: [[g["repeat"], g["scores"]] for g in r["judge_repeats"]] for r in records} == {
            f"Question {i}?": [[1, [-1.0, -1.0] if i == 0 else [8.0, 4.0]]] for i in range(6)}
        reviews = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="judge")
        assert summarize_gpt_review(Path(reviews) / f"review_{name}.jsonl")["all"] == 75.0
        assert summarize_gpt_review(Path(reviews) / f"review_{name}_repeat1.jsonl")["all"] == pytest.approx(second, abs=0.05)
        # again, in another experiment: every grading read from the cache, each repeat its own
        again = job.run(compose_cfg([*overrides, *judge_overrides(server.url), "tracking.experiment=again"]))
        assert len(server.requests) == 12 and again[f"{name}/judge_cache_hits"] == 12
        assert again[f"{name}/gpt_eval_llava_all"] == metrics[f"{name}/gpt_eval_llava_all"]


def test_mm_vet_repeats_give_the_mean_and_spread_of_its_total_score(tmp_path):
    """MM-Vet's evaluator: each run's total score, their mean, numpy's std of them."""
    task = judged_task(tmp_path, "mm_vet", lambda repeat, messages: ["0.5", "1.0", "0.0"][repeat], repeats=3)
    records = [task.process_results(r, ["An answer."]) for r in task.instances()]
    values, stderrs = task.corpus_metrics(records)
    assert values["gpt_eval_score"] == pytest.approx(50.0)
    assert values["gpt_eval_score_repeat_std"] == pytest.approx(40.82482904638631)  # np.std([50, 100, 0])
    assert values["judge_grades"] == 18 and values["judge_failure_rate"] == 0
    assert stderrs["gpt_eval_score"] == 0  # every document's mean over repeats is 0.5
    assert [g["score"] for g in task.grades(records[0])] == [0.5, 1.0, 0.0]
    # graded once (the default), the record and the metrics are what they were before repeats existed
    once = judged_task(tmp_path / "once", "mm_vet", "0.5")
    record = once.process_results(once.instances(1)[0], ["An answer."])
    assert "judge_repeats" not in record and record["score"] == 0.5
    assert "gpt_eval_score_repeat_std" not in once.corpus_metrics([record])[0]


def test_judge_options_are_checked_before_anything_loads(tmp_path):
    data, images = write_vlm_data(tmp_path / "data")
    base = ["model=tiny-llava", "task=mm_vet", f"data_dir={data}", f"task.tasks.mm_vet.image_dir={images}",
            *judge_overrides("http://127.0.0.1:9/v1")]
    with pytest.raises(ConfigError, match=r"judge.repeats=0: give a whole number of gradings per answer, 1 or more"):
        build_tasks(compose_cfg([*base, "judge.repeats=0"]))
    with pytest.raises(ConfigError, match=r"judge.max_failure_rate=5: give a share between 0 and 1"):
        build_tasks(compose_cfg([*base, "judge.max_failure_rate=5"]))


def test_the_run_key_follows_the_judge_model_not_where_it_is_served():
    from prunebench.tracking.run_key import run_key

    def key(*overrides):
        return run_key(compose_cfg(["model=tiny-llava", "task=mm_vet", *overrides]))

    served = key(*judge_overrides("http://127.0.0.1:1/v1"))
    assert served == key(*judge_overrides("http://10.0.0.2:8000/v1"), "judge.max_retries=9")
    assert served != key(*judge_overrides("http://127.0.0.1:1/v1"), "judge.model=another-judge")
    # repeats change the numbers, the failure limit the headline; at their defaults, the key of before
    assert served != key(*judge_overrides("http://127.0.0.1:1/v1"), "judge.repeats=3")
    assert served != key(*judge_overrides("http://127.0.0.1:1/v1"), "judge.max_failure_rate=0.2")
    assert served == run_key(compose_cfg(["model=tiny-llava", "task=mm_vet", *judge_overrides("http://127.0.0.1:1/v1"),
                                          "~judge.repeats", "~judge.max_failure_rate"]))
    # a task no judge grades keeps its key whether a judge is set or not
    assert run_key(compose_cfg(["model=tiny-llava", "task=easy_vqa"])) == run_key(
        compose_cfg(["model=tiny-llava", "task=easy_vqa", *judge_overrides("http://127.0.0.1:1/v1")]))


class RecordingJudge:
    """A judge that answers a fixed reply (or `text(repeat, messages)`) and keeps the messages it was sent."""

    model = "recording-judge"
    max_failure_rate = 0.05

    def __init__(self, text, repeats=1):
        self.text, self.messages, self.repeats = text, [], repeats

    def check(self):
        pass

    def reply(self, messages, temperature, max_tokens, repeat=0):
        self.messages.append(messages)
        return SimpleNamespace(text=self.text(repeat, messages) if callable(self.text) else self.text, cached=False)


def judged_task(tmp_path, name, reply, repeats=1):
    data, images = write_vlm_data(tmp_path / "data")
    task = build_tasks(compose_cfg(["model=tiny-llava", f"data_dir={data}", *judge_overrides("http://127.0.0.1:9/v1"),
                                    f"task={name}", f"task.tasks.{name}.image_dir={images}"]))[name]
    task.judge = RecordingJudge(reply, repeats)
    return task


@pytest.mark.parametrize("name", ["llava_bench_coco", "mm_vet"])
def test_the_judge_reads_the_answer_stripped_as_llava_writes_it(tmp_path, name):
    task = judged_task(tmp_path, name, "8 6" if name != "mm_vet" else "0.5")
    record = task.process_results(task.instances(1)[0], ["\n  The answer.  \n"])
    sent = task.judge.messages[0][-1]["content"]
    if name == "mm_vet":
        assert sent.endswith(" | The answer. | ")
    else:
        assert "[Assistant 2]\nThe answer.\n\n[End of Assistant 2]" in sent
    assert record["response"] == "\n  The answer.  \n"  # the record keeps what the model said


def summarize_gpt_review(path: Path) -> dict[str, float]:
    """LLaVA's summarize_gpt_review.py, its reading loop and score: one review per line, scores by
    `category` and 'all', model mean / reference mean x 100, rounded to 0.1."""
    scores = {}
    with open(path) as f:
        for review_str in f:
            review = json.loads(review_str)
            for key in (review["category"], "all"):
                scores.setdefault(key, []).append(review["tuple"])
    means = {k: [sum(t[i] for t in v) / len(v) for i in (0, 1)] for k, v in scores.items()}
    return {k: round(round(m[1], 3) / round(m[0], 3) * 100, 1) for k, m in means.items()}


@pytest.mark.parametrize("name, prefix", [("llava_bench_coco", ""), ("llava_bench_wild", "llava_bench_")])
def test_the_reviews_file_is_llavas_review_jsonl(tmp_path, name, prefix):
    task = judged_task(tmp_path, name, "8 6\nBoth fine.")
    records = [task.process_results(r, ["An answer."]) for r in task.instances()]
    (path, text), = task.artifacts(records).items()
    assert path == f"judge/review_{name}.jsonl"
    (tmp_path / "review.jsonl").write_text(text)
    reviews = lines(tmp_path / "review.jsonl")
    assert len(text.splitlines()) == len(records) == len(reviews)  # one JSON record per line
    assert [r["category"] for r in reviews] == [prefix + r["category"] for r in records]  # LLaVA's: llava_bench_conv
    assert reviews[0] == {"id": 1, "question_id": records[0]["question_id"], "category": prefix + records[0]["category"],
                          "content": "8 6\nBoth fine.", "tuple": [8.0, 6.0]}
    assert summarize_gpt_review(tmp_path / "review.jsonl")["all"] == 75.0


def test_a_dense_number_withheld_gives_a_pruned_run_no_stability_for_that_task(tmp_path, store):
    """The dense run's judge failed on 1 of 6 answers (withheld); the pruned run's judge read them all:
    its number is a headline, but pruned / dense has no dense number to rest on."""
    data, images = write_vlm_data(tmp_path / "data")
    failing = {"on": True}

    def script(body, auth):
        if failing["on"] and "What is 2? |" in user_text(body):
            return 200, "I cannot tell."
        return benchmark_judge(body, auth)

    base = ["model=tiny-llava", "task=mm_vet", f"data_dir={data}", *QUIET[:2], f"task.tasks.mm_vet.image_dir={images}",
            "task.tasks.mm_vet.max_gen_toks=8"]
    with ChatServer(script) as server:
        dense = job.run(compose_cfg([*base, "pruner=none", *judge_overrides(server.url)]))
        assert "avg/score" not in dense
        failing["on"] = False
        pruned = job.run(compose_cfg([*base, "pruner=magnitude", "sparsity=0.5", *judge_overrides(server.url)]))
    run = mlflow.search_runs(search_all_experiments=True, output_format="list", order_by=["start_time DESC"])[0]
    assert pruned["mm_vet/judge_failure_rate"] == 0 and pruned["avg/score"] == pruned["mm_vet/gpt_eval_score"]
    assert "stability/mm_vet" not in pruned and "prunebench.withheld" not in run.data.tags
    assert json.loads(run.data.tags["prunebench.stability_excluded"]) == {"mm_vet": "no dense value"}
