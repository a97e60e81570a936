"""A generation task graded by a judge model (LLaVA-Bench, MM-Vet): each answer goes to the judge in
process_results, and the task's scores are computed over all records together (`corpus_metrics`),
since LLaVA-Bench's is a ratio of means, not a mean of per-document values.

The judge is any object with `model`, `check()` and `reply(messages, temperature, max_tokens)`
(prunebench.judges), injected from `judge=` by the task's config; this module never imports one."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from prunebench.tasks.generation import GenerateUntilTask
from prunebench.tasks.sources import DocSource

log = logging.getLogger(__name__)

HOW_TO_SET_A_JUDGE = ("add judge=openai_compatible judge.model=<model> [judge.url=<server base URL>] (the key from "
                      "$OPENAI_API_KEY, or judge.api_key_env=null for a server without keys), or judge=hf_causal "
                      "judge.path=<hub id or local folder>")


def read_keyed(path) -> list[dict]:
    """A JSON object of documents keyed by their id (MM-Vet's mm-vet.json) as a list, each with its `id`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
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

    def ask(self, messages: list[dict], temperature: float | None = None) -> tuple[str, bool]:
        reply = self.judge.reply(messages, self.judge_temperature if temperature is None else temperature,
                                 self.judge_max_tokens)
        return reply.text, reply.cached

    @staticmethod
    def judge_counts(records: list[dict]) -> dict[str, float]:
        """How much judging the run did: requests it made, replies the cache answered, and replies
        whose score could not be read (each kept in predictions/ with the reply)."""
        unparsed = [r for r in records if not r["judge_parsed"]]
        if unparsed:
            log.warning("%d judge replies had no readable score (doc_ids %s); see judge_reply in predictions/",
                        len(unparsed), [r["doc_id"] for r in unparsed][:10])
        return {"judge_requests": float(sum(r["judge_requests"] for r in records)),
                "judge_cache_hits": float(sum(r["judge_cache_hits"] for r in records)),
                "judge_unparsed": float(len(unparsed))}


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
