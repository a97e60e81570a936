"""A generation task graded by a judge model (LLaVA-Bench, MM-Vet): each answer goes to the judge in
process_results, and the task's scores are computed over all records together (`corpus_metrics`),
since LLaVA-Bench's is a ratio of means, not a mean of per-document values.

The judge is any object with `model`, `repeats`, `max_failure_rate`, `check()` and
`reply(messages, temperature, max_tokens, repeat)` (prunebench.judges), injected from `judge=` by the
task's config; this module never imports one.

With `judge.repeats=N` each answer is graded N times (MM-Vet's protocol for the judge's variance):
a record holds the first grading in its own fields, as before repeats existed, and the others in
`judge_repeats`; each metric is computed per repeat and logged as their mean, with the spread across
repeats as `<metric>_repeat_std`."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from prunebench.tasks.generate_until import GenerateUntilTask
from prunebench.tasks.sources import DocSource, read_utf8

log = logging.getLogger(__name__)

HOW_TO_SET_A_JUDGE = ("add judge=openai_compatible judge.model=<model> [judge.url=<server base URL>] (the key from "
                      "$OPENAI_API_KEY, or judge.api_key_env=null for a server without keys), or judge=hf_causal "
                      "judge.path=<hub id or local folder>")


def read_keyed(path) -> list[dict]:
    """A JSON object of documents keyed by their id (MM-Vet's mm-vet.json) as a list, each with its `id`."""
    data = json.loads(read_utf8(Path(path)))
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object {{id: {{...}}}} of documents")
    return [{"id": key, **value} for key, value in data.items()]


@dataclass
class JudgedTask(GenerateUntilTask):
    """`references`: the file holding each question's reference answer, joined to the questions by
    `join`; `judge_temperature` / `judge_max_tokens`: the benchmark's own settings for the judge."""

    prompt_version: ClassVar[str] = ""

    references: DocSource | None = None
    judge: Any = None
    judge_temperature: float = 0.0
    judge_max_tokens: int = 1024
    _joined: list[dict] | None = field(default=None, init=False, repr=False)

    def check(self) -> None:
        if self.judge is None:
            raise ValueError(f"task {self.name} is graded by a judge model and none is set: {HOW_TO_SET_A_JUDGE}")
        self.judge.check()
        check_part(self.references, "references")
        super().check()

    @property
    def tags(self) -> dict[str, str]:
        """The judge and the prompt version: numbers from different judges are not comparable."""
        return {"prunebench.judge": self.judge.model, f"prunebench.judge_prompt.{self.name}": self.prompt_version}

    def docs(self, limit: int | None = None) -> list[dict]:
        if self._joined is None:
            self._joined = self.join(self.source.load(), self.references.load() if self.references else [])
        return self._joined[:limit] if limit else self._joined

    def join(self, questions: list[dict], references: list[dict]) -> list[dict]:
        return questions

    @staticmethod
    def answer(response: str) -> str:
        """The model's answer as the judge reads it: stripped, as LLaVA's model_vqa.py writes the
        answer files its review scripts and (through convert_mmvet_for_eval.py) MM-Vet's grader read."""
        return response.strip()

    def ask(self, messages: list[dict], temperature: float | None = None, repeat: int = 0) -> tuple[str, bool]:
        reply = self.judge.reply(messages, self.judge_temperature if temperature is None else temperature,
                                 self.judge_max_tokens, repeat=repeat)
        return reply.text, reply.cached

    def graded(self, record: dict, grade: Callable[[int], dict]) -> dict:
        """`record` with its gradings: `grade(repeat)` gives one grading's fields (with its
        `judge_requests` and `judge_cache_hits`); the first lands in the record's own fields, the
        others in `judge_repeats`, and the counts are summed over all of them."""
        grades = [grade(repeat) for repeat in range(self.judge.repeats)]
        counts = {key: sum(g.pop(key) for g in grades) for key in ("judge_requests", "judge_cache_hits")}
        out = {**record, **grades[0], **counts}
        if len(grades) > 1:
            out["judge_repeats"] = [{"repeat": repeat, **g} for repeat, g in enumerate(grades) if repeat]
        return out

    @staticmethod
    def grades(record: dict) -> list[dict]:
        """A record's gradings in repeat order: the record itself, then its `judge_repeats`."""
        return [record, *record.get("judge_repeats", [])]

    def over_repeats(self, records: list[dict], score: Callable[[list[dict], list[dict]], dict[str, float]]
                     ) -> dict[str, float]:
        """`score(records, gradings)` (one grading per record) for each repeat, as the mean over
        repeats and, with more than one, `<metric>_repeat_std`: numpy's std (ddof 0) of the repeats'
        values, as MM-Vet's evaluator reports the spread of its runs."""
        runs = [score(records, [self.grades(r)[repeat] for r in records]) for repeat in range(self.judge.repeats)]
        out = {}
        for metric in runs[0]:
            values = [run[metric] for run in runs]
            out[metric] = sum(values) / len(values)
            if len(values) > 1:
                out[f"{metric}_repeat_std"] = float(np.std(values))
        return out

    def judge_counts(self, records: list[dict]) -> dict[str, float]:
        """How much judging the run did: requests it made, replies the cache answered, gradings
        (documents x repeats) and those whose score could not be read (each kept in predictions/
        with the reply), and their share, `judge_failure_rate` (see `withheld`)."""
        grades = [(r["doc_id"], g) for r in records for g in self.grades(r)]
        unparsed = sorted({doc_id for doc_id, g in grades if not g["judge_parsed"]})
        failures = sum(not g["judge_parsed"] for _, g in grades)
        if failures:
            log.warning("%d of %d judge gradings had no readable score (doc_ids %s); see judge_reply in predictions/",
                        failures, len(grades), unparsed[:10])
        return {"judge_requests": float(sum(r["judge_requests"] for r in records)),
                "judge_cache_hits": float(sum(r["judge_cache_hits"] for r in records)),
                "judge_grades": float(len(grades)), "judge_unparsed": float(failures),
                "judge_failure_rate": ratio_or_nan(failures, len(grades))}

    def withheld(self, metrics: dict[str, float]) -> str | None:
        """Why the task gets no headline number (left out of avg/score and stability, named in the
        reports), or None: more of its gradings failed than judge.max_failure_rate allows."""
        rate = metrics.get(f"{self.name}/judge_failure_rate")
        if rate is None or not rate > self.judge.max_failure_rate:
            return None
        return (f"judge failure rate {rate:.3g} ({metrics[f'{self.name}/judge_unparsed']:.0f} of "
                f"{metrics[f'{self.name}/judge_grades']:.0f} gradings unreadable) exceeds "
                f"judge.max_failure_rate={self.judge.max_failure_rate:g}")


def check_part(source: DocSource | None, key: str) -> None:
    """A task's second file (references, context) checked, its message naming its own config key."""
    if source is None:
        return
    try:
        source.check()
    except FileNotFoundError as err:
        raise FileNotFoundError(str(err).replace("task.tasks.<task>.source.path", f"task.tasks.<task>.{key}.path")) from err


def ratio_or_nan(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan
