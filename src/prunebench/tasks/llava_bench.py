"""LLaVA-Bench (COCO and in-the-wild) as LLaVA's own scripts grade it (`llava/eval/
eval_gpt_review_visual.py` for COCO, `eval_gpt_review_bench.py` in the wild, `summarize_gpt_review.py`):
the judge reads the image's text context, the question, the GPT-4 reference answer as Assistant 1 and
the model's as Assistant 2, under the category's rule (`llava/eval/table/rule.json`), and writes the two
scores on its first line. Score = mean(model) / mean(reference) x 100, per category and overall
(lmms-eval's `gpt_eval_llava_{all,conv,detail,complex}`).

The rules and the parser are LLaVA's; hand-written because no installable package ships them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from prunebench.tasks.generate_until import Request, TakeFirst
from prunebench.tasks.judged import JudgedTask, check_part, ratio_or_nan
from prunebench.tasks.sources import DocSource

SYSTEM = "You are a helpful and precise assistant for checking the quality of the answer."
_RATE = ("Please rate the helpfulness, relevance, accuracy, level of details of their responses. Each assistant "
         "receives an overall score on a scale of 1 to 10, where a higher score indicates better overall "
         "performance.\nPlease first output a single line containing only two values indicating the scores for "
         "Assistant 1 and 2, respectively. The two scores are separated by a space.\nIn the subsequent line, please "
         "provide a comprehensive explanation of your evaluation, avoiding any potential bias and ensuring that the "
         "order in which the responses were presented does not affect your judgment.")
_ASK = ("We would like to request your feedback on the performance of two AI assistants in response to the user "
        "question displayed above. The user asks the question on observing an image. For your reference, the visual "
        "content in the image is represented with ")
# COCO's rule (captions and boxes) for conv / detail / complex; in the wild the llava_bench_* rule (captions)
COCO_RULE = (_ASK + "five descriptive sentences describing the same image and the bounding box coordinates of each "
             "object in the scene. These coordinates are in the form of bounding boxes, represented as (x1, y1, x2, "
             "y2) with floating numbers ranging from 0 to 1. These values correspond to the top left x, top left y, "
             "bottom right x, and bottom right y. \n" + _RATE)
WILD_RULE = _ASK + "a few sentences describing the image. \n" + _RATE
CATEGORIES = ("conv", "detail", "complex")
RULES = {**{c: COCO_RULE for c in CATEGORIES}, **{f"llava_bench_{c}": WILD_RULE for c in CATEGORIES}}
ROLE = "Assistant"  # every rule's role
UNPARSED = [-1.0, -1.0]  # LLaVA's value for a reply it cannot read; it stays in the means, as there


def context_text(context: dict) -> str:
    """COCO: the five captions, a blank line, one "category: [x1, y1, x2, y2]" per object; in the
    wild: the caption (a string or a list of lines)."""
    if "captions" in context:
        boxes = "\n".join(f"{box['category']}: {box['bbox']}" for box in context.get("instances", []))
        return "\n".join(context["captions"]) + "\n\n" + boxes
    caption = context["caption"]
    return "\n".join(caption) if isinstance(caption, list) else caption


def review_prompt(context: str, question: str, reference: str, answer: str, rule: str) -> str:
    return (f"[Context]\n{context}\n\n[Question]\n{question}\n\n"
            f"[{ROLE} 1]\n{reference}\n\n[End of {ROLE} 1]\n\n[{ROLE} 2]\n{answer}\n\n[End of {ROLE} 2]\n\n"
            f"[System]\n{rule}\n\n")


def parse_score(review: str) -> list[float] | None:
    """LLaVA's parse_score: the first line, commas as spaces, exactly two numbers; else None."""
    pair = review.split("\n")[0].replace(",", " ").split(" ")
    if len(pair) != 2:
        return None
    try:
        return [float(pair[0]), float(pair[1])]
    except ValueError:
        return None


METRICS = ("gpt_eval_llava_all", *(f"gpt_eval_llava_{c}" for c in CATEGORIES))


@dataclass
class LlavaBenchTask(JudgedTask):
    """`references`: the GPT-4 answers (LLaVA's qa90_gpt4_answer.jsonl / answers_gpt4.jsonl), joined by
    question_id; `context`: the text the judge sees for each image (COCO: caps_boxes_coco2014_val_80.jsonl
    with `captions` and `instances`; in the wild: context.jsonl with `caption`), joined by image;
    `rule_prefix`: "" for COCO's own rules, "llava_bench_" in the wild."""

    prompt_version: ClassVar[str] = "llava-1.5 rule.json"
    context: DocSource | None = None
    rule_prefix: str = ""
    judge_temperature: float = 0.2
    filters: dict = field(default_factory=lambda: {m: TakeFirst() for m in METRICS})

    def check(self) -> None:
        if self.context is None:
            raise ValueError(f"task {self.name}: the judge needs each image's text context; set "
                             f"task.tasks.{self.name}.context.path=FILE")
        check_part(self.context, "context")
        super().check()

    def join(self, questions: list[dict], references: list[dict]) -> list[dict]:
        answers = {r["question_id"]: r["text"] for r in references}
        contexts = {c["image"]: c for c in self.context.load()}
        docs = []
        for question in questions:
            qid = question["question_id"]
            if qid not in answers:
                raise ValueError(f"task {self.name}: question_id {qid} has no reference answer in "
                                 f"{self.references.describe()}")
            if question["image"] not in contexts:
                raise ValueError(f"task {self.name}: image {question['image']!r} (question_id {qid}) has no "
                                 f"context in {self.context.describe()}")
            if self.rule_prefix + question["category"] not in RULES:
                raise ValueError(f"task {self.name}: question_id {qid} has category {question['category']!r}; "
                                 f"LLaVA's rules cover {list(CATEGORIES)}")
            docs.append({**question, "reference": answers[qid], "context": context_text(contexts[question["image"]])})
        return docs

    def process_results(self, request: Request, responses: list[str]) -> dict:
        (response,) = responses
        doc = request.doc
        content = review_prompt(doc["context"], doc["text"], doc["reference"], self.answer(response),
                                RULES[self.rule_prefix + doc["category"]])
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]

        def grade(repeat: int) -> dict:
            reply, cached = self.ask(messages, repeat=repeat)
            scores = parse_score(reply)
            return {"judge_reply": reply, "judge_parsed": scores is not None, "scores": scores or UNPARSED,
                    "judge_requests": int(not cached), "judge_cache_hits": int(cached)}

        return self.graded({"task": request.task, "doc_id": request.doc_id, "question_id": doc["question_id"],
                            "category": doc["category"], "prompt": request.prompt, "target": doc["reference"],
                            "response": response, "judge_prompt": content}, grade)

    def corpus_metrics(self, records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
        """(values, standard errors): the relative score overall and per category present (no
        standard error: a ratio of means has no per-document values), and the judge's counts."""
        return {**self.over_repeats(records, relative_scores), **self.judge_counts(records)}, {}

    def artifacts(self, records: list[dict]) -> dict[str, str]:
        """The reviews as LLaVA's review scripts write them, one JSON record per line, with LLaVA's
        category (in the wild `llava_bench_<category>`, the rule's key), so its summarize_gpt_review.py
        reads the file (`-f FILE`, or `-d judge/`, which takes review_*.jsonl and scores each file).
        One file per repeat: `review_<task>.jsonl`, then `review_<task>_repeat<i>.jsonl`. LLaVA's
        answer1_id / answer2_id are left out: no answer here has an id, and the summary does not read them."""
        files = {}
        for repeat in range(self.judge.repeats):
            suffix = f"_repeat{repeat}" if repeat else ""
            files[f"judge/review_{self.name}{suffix}.jsonl"] = "".join(
                json.dumps({"id": i + 1, "question_id": r["question_id"], "category": self.rule_prefix + r["category"],
                            "content": g["judge_reply"], "tuple": g["scores"]}) + "\n"
                for i, (r, g) in enumerate((r, self.grades(r)[repeat]) for r in records))
        return files


def relative_scores(records: list[dict], gradings: list[dict]) -> dict[str, float]:
    """One grading per record: mean(model) / mean(reference) x 100 overall and per category present."""
    values = {}
    for metric, category in zip(METRICS, ("all", *CATEGORIES)):
        pairs = [g["scores"] for r, g in zip(records, gradings) if category in ("all", r["category"])]
        if pairs:
            reference, model = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
            values[metric] = ratio_or_nan(model, reference) * 100
    return values
