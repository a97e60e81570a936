"""What every judge shares: each reply kept on disk as JSON, keyed by the judge model and the full
request, so a rerun (or another pruned model giving an answer seen before) asks nothing twice."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from prunebench.cache import cache_dir, content_key


@dataclass
class JudgeReply:
    text: str
    cached: bool  # read from the disk cache, no request made


class Judge:
    """`model` names the grading model (its id on the server, or a checkpoint path): part of the
    cache key and the `prunebench.judge` tag. `repeats`: how many times each answer is graded (MM-Vet's
    protocol for the judge's variance: the mean and the spread across gradings); `max_failure_rate`:
    the share of unreadable grades above which a task gets no headline number. Subclasses implement
    `complete`."""

    def __init__(self, model: str, name: str | None = None, repeats: int = 1, max_failure_rate: float = 0.05):
        if not model:
            raise ValueError("judge.model is empty: name the grading model (e.g. judge.model=gpt-4-0613)")
        if not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"judge.repeats={repeats!r}: give a whole number of gradings per answer, 1 or more")
        if not 0.0 <= max_failure_rate <= 1.0:
            raise ValueError(f"judge.max_failure_rate={max_failure_rate!r}: give a share between 0 and 1 "
                             f"(0.05: more than 5% unreadable grades withholds the task's score)")
        self.model, self.name = model, name or type(self).__name__
        self.repeats, self.max_failure_rate = repeats, float(max_failure_rate)

    def check(self) -> None:
        """Raises before any model loads when the judge cannot work (a missing key, say)."""

    def reach(self) -> None:
        """Raises ValueError before any model loads when the judge cannot be reached. A request on
        the network, so validation asks it once per job, not `check()` (tasks are built offline too)."""

    def complete(self, messages: list[dict], temperature: float, max_tokens: int) -> str:
        raise NotImplementedError

    def reply(self, messages: list[dict], temperature: float = 0.0, max_tokens: int = 1024,
              repeat: int = 0) -> JudgeReply:
        """The cached reply, else a fresh one stored before it is returned. The sampling settings
        are in the key too: MM-Vet asks again at a higher temperature when a reply does not parse.
        `repeat`: which grading of the answer this is; each has its own cache entry, so a repeat is
        a new request, never the first grading read back (repeat 0 keeps the key it had before)."""
        request = {"judge": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if repeat:
            request["repeat"] = repeat
        path = cache_dir("judge") / f"{content_key(request)}.json"
        if path.is_file():
            return JudgeReply(json.loads(path.read_text(encoding="utf-8"))["reply"], cached=True)
        text = self.complete(messages, temperature, max_tokens)
        # written whole or not at all: parallel jobs may judge the same answer
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as out:
            json.dump({**request, "reply": text}, out)
        os.replace(out.name, path)
        return JudgeReply(text, cached=False)
