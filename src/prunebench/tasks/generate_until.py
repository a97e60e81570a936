"""A `generate_until` task, built the way lm-eval builds that output type: each
document becomes one prompt (description, few-shot exemplars, the document), the model generates
greedily until a stop string, answer filters turn the text into answers, exact match scores them.

Tasks that share their generation settings can be evaluated as one `TaskGroup`: their requests are
batched together and the group reports a size-weighted (lm-eval) or plain (OpenCompass) mean."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from prunebench.api.requests import GENERATE_UNTIL, Document, GenerateUntil
from prunebench.tasks.images import file_problem, image_store
from prunebench.tasks.sources import DocSource
from prunebench.tasks.template import resolve


class AnswerFilter(Protocol):
    def __call__(self, response: str, doc: dict) -> str: ...


class TakeFirst:
    """The raw generation (lm-eval's `take_first` over a single response)."""

    def __call__(self, response: str, doc: dict) -> str:
        return response


@dataclass
class Regex:
    """lm-eval's `regex` filter: match `group_select` of all matches; of a match with several groups
    the first non-empty one; stripped; `fallback` when nothing matches."""

    pattern: str
    group_select: int = 0
    fallback: str = "[invalid]"

    def __post_init__(self):
        self._regex = re.compile(self.pattern)

    def __call__(self, response: str, doc: dict) -> str:
        found = self._regex.findall(response)
        if not found:
            return self.fallback
        match = found[self.group_select]
        if isinstance(match, tuple):
            match = next((m for m in match if m), self.fallback)
        return match.strip()


@dataclass
class ExactMatch:
    """lm-eval's `exact_match` (HF evaluate's): each ignored regex removed from both strings in
    order, then both lower-cased when `ignore_case`."""

    ignore_case: bool = False
    regexes_to_ignore: list[str] = field(default_factory=list)

    def __call__(self, prediction: str, reference: str) -> float:
        for pattern in self.regexes_to_ignore:
            prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
        if self.ignore_case:
            import numpy as np

            # numpy's case mapping, as lm-eval's (str.lower differs on a few letters such as "İ")
            prediction, reference = np.char.lower([prediction, reference]).tolist()
        return float(prediction == reference)


@dataclass
class Request(Document):
    """One document as a generation request of the member task `task`."""

    task: str = ""
    target: str = ""

    @property
    def prompt(self) -> str:
        return self.requests[0].prompt


@dataclass
class GenerateUntilTask:
    """`filters` maps each metric name to the filter whose answer it scores (the first one is the
    headline); `target_filter` normalises the reference too (OpenCompass's option letters).
    `fewshot`: exemplar documents, rendered with the same templates, `target_delimiter` between
    question and answer and `fewshot_delimiter` after each. `doc_to_image` (a field or template
    naming an image in `image_dir`: a folder, a .zip or an HF dataset, see tasks/images.py; an
    absolute file name; or the picture itself, as an HF dataset's image column holds it) makes each
    request carry its image, for a vision-language model."""

    kind: ClassVar[str] = GENERATE_UNTIL
    lower_is_better: ClassVar[bool] = False
    grouped: ClassVar[bool] = False  # evaluated alone: no group score

    name: str
    source: DocSource
    doc_to_text: str
    doc_to_target: str = "{{target}}"
    description: str = ""
    fewshot: list[dict] = field(default_factory=list)
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    until: list[str] = field(default_factory=list)
    max_gen_toks: int = 256
    filters: dict[str, AnswerFilter] = field(default_factory=lambda: {"exact_match": TakeFirst()})
    metric: ExactMatch = field(default_factory=ExactMatch)
    target_filter: AnswerFilter | None = None
    primary: str | None = None
    doc_to_image: str | None = None
    image_dir: str | None = None
    image_column: str = "image"  # an HF dataset image_dir: its image feature
    image_key: str | None = None  # ... and the column naming each picture (None: the file name it was stored under)
    # the chat format its prompts are rendered in (evaluation/chat.py), set before its requests are
    # built; None: the raw prompts
    chat: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.until = list(self.until)
        self.primary = self.primary or next(iter(self.filters))
        if self.primary not in self.filters:
            raise ValueError(f"task {self.name}: primary={self.primary!r} must be one of {list(self.filters)}")
        if self.max_gen_toks < 1:
            raise ValueError(f"task {self.name}: max_gen_toks={self.max_gen_toks} must be positive")

    @property
    def metrics(self) -> list[str]:
        return list(self.filters)

    @property
    def members(self) -> list[GenerateUntilTask]:
        return [self]

    def check(self) -> None:
        self.source.check()
        if self.doc_to_image:
            self.check_images()

    def check_images(self, shown: int = 5) -> None:
        """Every document's image exists and has a header PIL reads (not its pixels): a run that
        would fail on image 3000 fails before any model loads."""
        names = [resolve(self.doc_to_image, doc) for doc in self.docs()]
        names = list(dict.fromkeys(str(name) for name in names if isinstance(name, (str, Path))))  # pictures themselves need no check
        absolute = [name for name in names if Path(name).is_absolute()]
        missing = [name for name in absolute if not Path(name).is_file()]
        relative = [name for name in names if not Path(name).is_absolute()]
        if relative:
            store = self.image_store()
            missing += [name for name in relative if not store.has(name)]
        if missing:
            raise FileNotFoundError(f"task {self.name}: {len(missing)} image(s) missing in image_dir="
                                    f"{self.image_dir!r}, first: {missing[:shown]}")
        problems = {name: why for name in absolute if (why := file_problem(Path(name)))}
        if relative:
            problems.update(self.image_store().problems(relative))
        if problems:
            first = "; ".join(f"{name} ({why})" for name, why in list(problems.items())[:shown])
            raise ValueError(f"task {self.name}: {len(problems)} image(s) cannot be read, first: {first}; "
                             f"replace or remove them (or their documents)")

    def image_store(self):
        """The store behind `image_dir`, opened once (a zip's index, a dataset's name column)."""
        if not self.image_dir:
            raise FileNotFoundError(f"task {self.name} reads images: set task.tasks.{self.name}.image_dir=PATH "
                                    f"(the benchmark's image folder, a .zip of it, or an HF dataset)")
        if getattr(self, "_image_store", None) is None:
            self._image_store = image_store(self.image_dir, self.image_column, self.image_key)
        return self._image_store

    def image(self, doc: dict):
        """An absolute name is the file; a relative one is looked up in `image_dir`; anything else
        is the picture itself."""
        value = resolve(self.doc_to_image, doc)
        if not isinstance(value, (str, Path)):
            return value
        return Path(value) if Path(value).is_absolute() else self.image_store().ref(str(value))

    def docs(self, limit: int | None = None) -> list[dict]:
        docs = self.source.load()
        return docs[:limit] if limit else docs

    @property
    def renders_chat(self) -> bool:
        """Its prompts take a chat format (evaluation/chat.py), unless it reads images (a processor's
        template renders those) or a subclass builds its prompt otherwise."""
        return not self.doc_to_image and type(self).prompt is GenerateUntilTask.prompt

    def prompt(self, doc: dict) -> str:
        if self.chat is not None:
            shots = [(resolve(self.doc_to_text, ex), str(resolve(self.doc_to_target, ex))) for ex in self.fewshot]
            return self.chat.context(resolve(self.doc_to_text, doc), self.description, shots, self.target_delimiter,
                                     self.fewshot_delimiter)
        shots = "".join(resolve(self.doc_to_text, ex) + self.target_delimiter + str(resolve(self.doc_to_target, ex))
                        + self.fewshot_delimiter for ex in self.fewshot)
        return self.description + shots + resolve(self.doc_to_text, doc)

    def instances(self, limit: int | None = None) -> list[Request]:
        return [Request(i, [GenerateUntil(self.prompt(doc), self.images(doc))], doc, self.name,
                        str(resolve(self.doc_to_target, doc))) for i, doc in enumerate(self.docs(limit))]

    def images(self, doc: dict) -> tuple:
        return (self.image(doc),) if self.doc_to_image else ()

    def labelled_batches(self, loaded, n_samples: int, seed: int, batch_size: int) -> list[dict]:
        """Image+text calibration (calib=labelled on a split that is not evaluated): `n_samples`
        documents drawn by `seed`, each prompt with its image and reference answer, labelled on the
        answer only (the model adapter's `labelled_inputs`)."""
        docs = self.docs()
        picked = [docs[i] for i in random.Random(seed).sample(range(len(docs)), min(n_samples, len(docs)))]
        rows = [(self.prompt(doc), str(resolve(self.doc_to_target, doc)), list(self.images(doc))) for doc in picked]
        unanswered = [i for i, (_, answer, _) in enumerate(rows) if not answer.strip()]
        if unanswered:
            raise ValueError(f"task {self.name}: {len(unanswered)} calibration document(s) have no reference answer "
                             f"(doc_to_target={self.doc_to_target!r}); calibrate on a split with answers")
        batches = []
        for start in range(0, len(rows), batch_size):
            prompts, answers, images = map(list, zip(*rows[start:start + batch_size]))
            batch = loaded.labelled_inputs(prompts, answers, images)
            batches.append({key: value.to(loaded.device) for key, value in batch.items()})
        return batches

    def score(self, response: str, request: Request) -> tuple[dict[str, str], dict[str, float]]:
        """(the filtered answer of each metric, each metric's value)."""
        target = self.target_filter(request.target, request.doc) if self.target_filter else request.target
        answers = {name: f(response, request.doc) for name, f in self.filters.items()}
        return answers, {name: self.metric(answer, target) for name, answer in answers.items()}

    def process_results(self, request: Request, responses: list[str]) -> dict:
        (response,) = responses
        answers, values = self.score(response, request)
        return {"task": request.task, "doc_id": request.doc_id, "prompt": request.prompt, "target": request.target,
                "response": response, **{f"{m}_answer": a for m, a in answers.items()}, **values}


@dataclass
class TaskGroup:
    """Member tasks evaluated in one test loop, reported per member and as a group: the mean
    weighted by each member's evaluated documents (`weight_by_size`, lm-eval's group score) or the
    plain mean of the member scores (OpenCompass's summariser)."""

    kind: ClassVar[str] = GENERATE_UNTIL
    lower_is_better: ClassVar[bool] = False
    grouped: ClassVar[bool] = True

    name: str
    tasks: list[GenerateUntilTask]
    weight_by_size: bool = True

    @property
    def renders_chat(self) -> bool:
        return all(member.renders_chat for member in self.tasks)

    def __post_init__(self):
        if not self.tasks:
            raise ValueError(f"task group {self.name} has no member tasks")
        first = self.tasks[0]
        for task in self.tasks[1:]:
            if (task.until, task.max_gen_toks, task.metrics) != (first.until, first.max_gen_toks, first.metrics):
                raise ValueError(f"task group {self.name}: {task.name} differs from {first.name} in stop strings, "
                                 f"max_gen_toks or metrics; a group's requests are generated together")

    @property
    def members(self) -> list[GenerateUntilTask]:
        return self.tasks

    @property
    def metrics(self) -> list[str]:
        return self.tasks[0].metrics

    @property
    def primary(self) -> str:
        return self.tasks[0].primary

    @property
    def until(self) -> list[str]:
        return self.tasks[0].until

    @property
    def max_gen_toks(self) -> int:
        return self.tasks[0].max_gen_toks

    def check(self) -> None:
        for task in self.tasks:
            task.check()

    def instances(self, limit: int | None = None) -> list[Request]:
        """Every member's requests (`limit` per member); each names its member task."""
        return [request for task in self.tasks for request in task.instances(limit)]

    def process_results(self, request: Request, responses: list[str]) -> dict:
        return next(t for t in self.tasks if t.name == request.task).process_results(request, responses)

    def aggregate(self, means: list[float], stderrs: list[float], sizes: list[int]) -> tuple[float, float]:
        """(group score, its standard error): lm-eval's pooled_sample_stderr for the size-weighted
        mean, sqrt(sum se^2) / k for the plain one."""
        if self.weight_by_size:
            total = sum(sizes)
            score = sum(m * n for m, n in zip(means, sizes)) / total
            if total <= len(sizes):
                return score, float("nan")
            pooled = sum((n - 1) * se ** 2 * n for se, n in zip(stderrs, sizes)) / (total - len(sizes))
            return score, math.sqrt(pooled / total)
        return sum(means) / len(means), math.sqrt(sum(se ** 2 for se in stderrs)) / len(stderrs)
