"""MM-Vet as its own grader scores it (`mm-vet_evaluator.py`): a few-shot prompt in MM-Vet's text,
byte for byte (lmms-eval's `mmvet` copy drops the blank line before the table and heads its first
column `gpt_query_prompt`, its variable's name, instead of `Question`), asks the judge for a 0.0-1.0
correctness of the prediction against the reference (`<AND>` / `<OR>` spaced out); a reply whose
first word is not a number in [0, 1] is asked again with "Predict the correctness of the answer
(digit): " appended, at a rising temperature, and after five tries scores 0.0. Score = mean x 100,
overall and per capability (rec, ocr, know, gen, spat, math) over the samples needing it.

Questions come from LLaVA's llava-mm-vet.jsonl (question_id i is MM-Vet's "v1_i"); the references and
capabilities from MM-Vet's own mm-vet.json (not in LLaVA's tree). Hand-written: no package ships it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prunebench.api.metrics import mean_stderr
from prunebench.tasks.generate_until import Request, TakeFirst
from prunebench.tasks.judged import JudgedTask

GRADER_PROMPT = """Compare the ground truth and prediction from AI models, to give a correctness score for the prediction. <AND> in the ground truth means it is totally right only when all elements in the ground truth are present in the prediction, and <OR> means it is totally right when any one element in the ground truth is present in the prediction. The correctness score is 0.0 (totally wrong), 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, or 1.0 (totally right). Just complete the last space of the correctness score.

Question | Ground truth | Prediction | Correctness
--- | --- | --- | ---
What is x in the equation? | -1 <AND> -5 | x = 3 | 0.0
What is x in the equation? | -1 <AND> -5 | x = -1 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 or 5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -1 or x = -5 | 1.0
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these countries do not accurately represent their landscapes. | The meme talks about Iceland and Greenland. It's pointing out that despite their names, Iceland is not very icy and Greenland isn't very green. | 0.4
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these countries do not accurately represent their landscapes. | The meme is using humor to point out the misleading nature of Iceland's and Greenland's names. Iceland, despite its name, has lush green landscapes while Greenland is mostly covered in ice and snow. The text 'This is why I have trust issues' is a playful way to suggest that these contradictions can lead to distrust or confusion. The humor in this meme is derived from the unexpected contrast between the names of the countries and their actual physical characteristics. | 1.0
"""
RETRY_SUFFIX = "\nPredict the correctness of the answer (digit): "
CAPABILITIES = ("rec", "ocr", "know", "gen", "spat", "math")


def grader_prompt(question: str, answer: str, prediction: str) -> str:
    gold = answer.replace("<AND>", " <AND> ").replace("<OR>", " <OR> ")
    return GRADER_PROMPT + "\n" + " | ".join([question, gold, prediction, ""])


def parse_correctness(reply: str) -> float | None:
    """The first space-separated word as a number in [0, 1], else None."""
    try:
        score = float(reply.split(" ")[0].strip())
    except ValueError:
        return None
    return score if 0.0 <= score <= 1.0 else None


@dataclass
class MMVetTask(JudgedTask):
    """`references`: mm-vet.json ({"v1_<i>": {question, answer, capability, imagename}});
    `attempts`: grading tries before a sample scores 0.0 (MM-Vet's 5)."""

    prompt_version: ClassVar[str] = "mm-vet grader (mm-vet_evaluator.py's text, v2)"
    judge_max_tokens: int = 3  # MM-Vet's: the score and nothing else
    attempts: int = 5
    filters: dict = field(default_factory=lambda: {m: TakeFirst() for m in ("gpt_eval_score", *CAPABILITIES)})

    def check(self) -> None:
        if self.references is None:
            raise ValueError(f"task {self.name}: the reference answers are MM-Vet's mm-vet.json (in its release "
                             f"zip, not in LLaVA's llava-mm-vet.jsonl); set task.tasks.{self.name}.references.path=FILE")
        super().check()

    def join(self, questions: list[dict], references: list[dict]) -> list[dict]:
        gold = {r["id"]: r for r in references}
        docs = []
        for question in questions:
            key = f"v1_{question['question_id']}"
            if key not in gold:
                raise ValueError(f"task {self.name}: question_id {question['question_id']} ({key}) is not in "
                                 f"{self.references.describe()}")
            docs.append({**question, "answer": gold[key]["answer"], "capability": list(gold[key]["capability"])})
        return docs

    def process_results(self, request: Request, responses: list[str]) -> dict:
        """MM-Vet's loop: the prompt at temperature 0; then with the retry suffix at 0.0, 0.5, 1.0, 1.5
        (its temperature rises after each retry). Its sixth request, whose reply it discards, is not made."""
        (response,) = responses
        doc = request.doc
        prompt = grader_prompt(doc["text"], doc["answer"], self.answer(response))

        def grade(repeat: int) -> dict:
            replies, requests, hits, score = [], 0, 0, None
            for attempt in range(self.attempts):
                text = prompt if attempt == 0 else prompt + RETRY_SUFFIX
                reply, cached = self.ask([{"role": "user", "content": text}],
                                         self.judge_temperature + 0.5 * max(0, attempt - 1), repeat)
                replies.append(reply)
                hits, requests = hits + cached, requests + (not cached)
                score = parse_correctness(reply)
                if score is not None:
                    break
            return {"judge_reply": replies[-1], "judge_replies": replies, "judge_parsed": score is not None,
                    "score": 0.0 if score is None else score, "judge_requests": requests, "judge_cache_hits": hits}

        return self.graded({"task": request.task, "doc_id": request.doc_id, "question_id": doc["question_id"],
                            "capability": doc["capability"], "prompt": request.prompt, "target": doc["answer"],
                            "response": response, "judge_prompt": prompt}, grade)

    def corpus_metrics(self, records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
        """Means x 100 (overall `gpt_eval_score`, lmms-eval's name; each capability present), over
        repeats as MM-Vet's evaluator averages its runs, and their standard errors (lm-eval's
        mean_stderr of each document's score, averaged over repeats, x 100)."""
        def means(records: list[dict], gradings: list[dict]) -> dict[str, float]:
            return {metric: sum(g["score"] for g in part) / len(part) * 100
                    for metric, part in self.by_metric(records, gradings).items()}

        averaged = [{"score": sum(g["score"] for g in self.grades(r)) / len(self.grades(r))} for r in records]
        stderrs = {metric: mean_stderr([g["score"] for g in part]) * 100
                   for metric, part in self.by_metric(records, averaged).items()}
        return {**self.over_repeats(records, means), **self.judge_counts(records)}, stderrs

    def by_metric(self, records: list[dict], gradings: list[dict]) -> dict[str, list[dict]]:
        """{metric: the gradings of the records it covers}: every record for `gpt_eval_score`, those
        needing the capability for each capability (only those present)."""
        parts = {metric: [g for r, g in zip(records, gradings) if metric == "gpt_eval_score" or metric in r["capability"]]
                 for metric in self.metrics}
        return {metric: part for metric, part in parts.items() if part}
