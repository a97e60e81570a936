"""Any lm-evaluation-harness task, group or tag-free name, built by lm-eval's own TaskManager: its
documents, few-shot examples (lm-eval's sampler and seed), requests, filters, per-document
`process_results`, aggregations and group averages are lm-eval's code, run. prunebench's engines
only answer the requests, by kind, in the Lightning test loop; nothing of a task is rewritten.

One LmEvalTask is one name a user asked for. A group (MMLU) is one task here whose documents are
all its members' documents; it logs the group's metrics as `<group>/<metric>` and every member's
and subgroup's as `<member>/<metric>`, each with lm-eval's stderr."""

from __future__ import annotations

from typing import ClassVar

import contextlib
import difflib
import io
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

from prunebench.api.requests import (GENERATE_UNTIL, LOGLIKELIHOOD, Document, GenerateUntil, Loglikelihood,
                                     RollingText)
from prunebench.hub import HubDeferred, plan_notes
from prunebench.tasks.duplicates import warn_duplicate_ids
from prunebench.tasks.lm_eval_data import LocalData, local_factory

# lm-eval's output types -> the request kind our engines answer them as (multiple_choice is
# loglikelihood requests, one per choice; loglikelihood_rolling is scored as windows of them)
KINDS = {"multiple_choice": LOGLIKELIHOOD, "loglikelihood": LOGLIKELIHOOD, "loglikelihood_rolling": LOGLIKELIHOOD,
         "generate_until": GENERATE_UNTIL}
FEWSHOT_SEED = 1234  # simple_evaluate's fewshot_random_seed
BOOTSTRAP_ITERS = 100000  # simple_evaluate's bootstrap_iters (stderr of perplexity, F1, MCC)
HFLM_MAX_GEN_TOKS = 256  # HFLM's default when a task's generation_kwargs name none
# a plan's built tasks by definition (LmEvalTask.check): 18 jobs of one preset share 7 tasks
PLANNED: dict[str, tuple[dict, list[str]]] = {}


@lru_cache(maxsize=4)
def task_index(include_path: tuple[str, ...] = ()):
    """lm-eval's TaskManager over every task, group and tag (and the user's include_path folders),
    made once per process, its built-in index read from the cache (lm_eval_index.py)."""
    from prunebench.tasks.lm_eval_index import task_manager

    return task_manager(list(include_path))


@lru_cache(maxsize=256)
def _lm_eval_template(source: str):
    import lm_eval.utils

    return type(lm_eval.utils.env).from_string(lm_eval.utils.env, source)


@contextlib.contextmanager
def templates_compiled_once():
    """lm-eval compiles a task's Jinja template again for every document it renders (`utils.apply_template`
    calls its environment's `from_string` each time: doc_to_text, doc_to_target and doc_to_choice,
    in building the requests and again in process_results), which is most of the time it takes
    to build a task's requests. Inside this block its environment remembers each template it compiled
    (the same source in the same environment is the same template, so the same strings render);
    lm-eval's own evaluate() is left as it ships. docs/lm-eval-tasks.md "Fast" has the numbers."""
    import lm_eval.utils

    env = lm_eval.utils.env
    if "from_string" in vars(env):  # inside another such block
        yield
        return
    env.from_string = _lm_eval_template
    try:
        yield
    finally:
        del env.from_string


def metric_name(metric: str, filter_name: str, filters: list[str]) -> str:
    """`<metric>` where the task has one filter, `<metric>_<filter>` where it has several (gsm8k's
    strict-match and flexible-extract); MLflow refuses lm-eval's comma."""
    return metric if len(filters) == 1 else f"{metric}_{filter_name}"


@dataclass
class LmEvalDocument(Document):
    """One lm-eval document: its leaf task, its id there, and lm-eval's own Instances, on which the
    responses are set so lm-eval's filters and process_results read them as they would."""

    task: str = ""
    task_doc_id: int = 0
    instances: list = field(default_factory=list, repr=False)

    @property
    def prompt(self) -> str:  # the generation engine's sort key
        return self.requests[0].prompt


class LmEvalTask:
    """`task`: the lm-eval name (default: `name`). `num_fewshot`: lm-eval's --num_fewshot (None: the
    task's own; a task whose config fixes 0 keeps 0, as lm-eval does). `primary`: the metric the
    average and stability use (default: the first). `include_path`: folders of the user's lm-eval
    YAML. `data_dir` / `data_files`: local files instead of the hub (lm_eval_data.py). `fewshot_split`:
    the split few-shot examples are drawn from, lm-eval's task field of that name (None: the task's own
    rule), for a task whose own split is not at hand offline (ARC's train split)."""

    lower_is_better = False
    grouped = False
    deferred = False  # a plan's: its data is on the hub only, so it was not built (hub.deferring)
    renders_chat: ClassVar[bool] = True  # lm-eval renders its requests in a chat format (evaluation/chat.py)
    chat = None  # the chat format lm-eval renders the requests in (evaluation/chat.py); None: raw prompts

    def __init__(self, name: str, task: str | None = None, num_fewshot: int | None = None, primary: str | None = None,
                 include_path: list[str] | str | None = None, data_dir: str | None = None,
                 data_files: dict | None = None, fewshot_seed: int = FEWSHOT_SEED,
                 bootstrap_iters: int = BOOTSTRAP_ITERS, fewshot_split: str | None = None):
        self.name, self.lm_eval_name = name, task or name
        self.num_fewshot, self.fewshot_seed, self.bootstrap_iters = num_fewshot, fewshot_seed, bootstrap_iters
        paths = [include_path] if isinstance(include_path, str) else list(include_path or [])
        self.include_path = tuple(str(p) for p in paths)
        self.local = LocalData(data_dir, data_files, num_fewshot, fewshot_split)
        self._primary = primary
        self.leaves: dict = {}
        self.groups: dict = {}

    # ---------------------------------------------------------------- building (validation)

    def check(self) -> None:
        """Builds the task with lm-eval (documents read, local files checked): a name lm-eval does not
        know fails naming the close matches; a missing file names the task, split and path. A plan
        builds each definition once for all its jobs (a job builds its own: evaluating a task draws
        its few-shot examples from a generator that must start at the seed)."""
        if self.leaves:
            return
        key = json.dumps([self.name, self.lm_eval_name, self.num_fewshot, self.include_path, self.local.data_dir,
                          self.local.data_files, self.local.fewshot_split, self.fewshot_seed, self.bootstrap_iters],
                         sort_keys=True, default=str)
        notes = plan_notes()
        if notes is None:
            self._build()
            return
        if key not in PLANNED:
            before = list(notes)
            self._build()
            PLANNED[key] = dict(self.__dict__), [n for n in notes if n not in before]
        state, noted = PLANNED[key]
        self.__dict__.update(state)
        notes.extend(n for n in noted if n not in notes)  # each job's line names what its task needs

    def _build(self) -> None:
        manager = task_index(self.include_path)
        if self.lm_eval_name not in manager.all_tasks:
            close = difflib.get_close_matches(self.lm_eval_name, manager.all_tasks, n=5, cutoff=0.6)
            raise ValueError(f"lm-eval has no task, group or tag {self.lm_eval_name!r}"
                             f"{'; close matches: ' + ', '.join(close) if close else ''}"
                             f"{' (include_path: ' + ', '.join(self.include_path) + ')' if self.include_path else ''}")
        manager._factory = local_factory(self.local, manager.metadata)  # the one place leaf configs are assembled
        try:
            loaded = manager.load([self.lm_eval_name])
        except HubDeferred:  # a plan: a dataset only the hub has is noted, and the task built when the job starts
            self.deferred = True
            return
        self.leaves, self.groups = loaded["tasks"], loaded.get("groups", {})
        if len(self.leaves) > 1 and self.lm_eval_name not in self.groups:
            raise ValueError(f"{self.lm_eval_name!r} is an lm-eval tag of {len(self.leaves)} tasks with no group score; "
                             f"list them as tasks of their own: {sorted(self.leaves)}")
        kinds = {leaf: KINDS.get(t.get_config("output_type")) for leaf, t in self.leaves.items()}
        if None in kinds.values() or len(set(kinds.values())) > 1:
            kinds = sorted({t.get_config('output_type') for t in self.leaves.values()})
            raise ValueError(f"lm-eval {self.lm_eval_name}: its tasks' output types {kinds} "
                             f"are not one request kind prunebench answers ({sorted(KINDS)}); list its tasks separately")
        self.kind = next(iter(kinds.values()))
        for leaf, task in self.leaves.items():
            self._configure(task)
            self._check_fewshot(leaf, task)
            split = task.config.test_split or task.config.validation_split
            if split in (getattr(task, "dataset", None) or {}):  # as read: its process_docs would run again
                warn_duplicate_ids(leaf, task.dataset[split], f"lm-eval's {split} split")
        if self.kind == GENERATE_UNTIL:
            self._generation_settings()
        if self._primary is not None and self._primary not in self.metrics:
            raise ValueError(f"lm-eval {self.lm_eval_name}: primary={self._primary!r} is not one of its metrics {self.metrics}")
        if not self.metrics:
            raise ValueError(f"lm-eval group {self.lm_eval_name} reports no aggregate metric (no aggregate_metric_list); "
                             f"list its tasks as tasks of their own: {sorted(self.leaves)}")
        self.lower_is_better = not self.higher_is_better()

    def _configure(self, task) -> None:
        """num_fewshot and the few-shot seed exactly as simple_evaluate sets them."""
        if self.num_fewshot is not None:
            if task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=self.num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=self.fewshot_seed)

    def _check_fewshot(self, leaf: str, task) -> None:
        """lm-eval's sampler draws num_fewshot examples with random.sample (the first ones under
        `first_n`), one more when they come from the evaluated split, to leave the document itself
        out: more than the split holds fails there ("Sample larger than population"), once the
        model has loaded. Its documents are read by now (before any model)."""
        shots = task.get_config("num_fewshot") or 0
        if not shots:
            return
        sampler = getattr(task, "sampler", None)
        pool = len(sampler.fewshot_docs()) if sampler is not None else 0
        split = getattr(getattr(task, "fewshot_cfg", None), "split", None)
        same = split == task.config.test_split  # lm-eval's own test for leaving the evaluated document out
        if pool >= shots + same:
            return
        where = "task.num_fewshot or its task.lm_eval entry" if self.num_fewshot is not None else "the task's own"
        drawn = split or task.config.training_split or task.config.validation_split  # lm-eval's fallbacks
        member = f"its member {leaf}: " if leaf != self.lm_eval_name else ""
        less = ", less the one evaluated" if same else ""
        larger = f", or give a larger split (+task.data_files.{leaf}.{drawn}=FILE)" if self.local.active and drawn else ""
        raise ValueError(f"{member}num_fewshot={shots} ({where}) examples per document, but the split they are drawn "
                         f"from ({drawn!r}) holds {pool} document(s){less}; use num_fewshot={max(pool - same, 0)} "
                         f"or fewer{larger}")

    def _generation_settings(self) -> None:
        """The generation engine runs one greedy decode per batch: stop strings and token budget
        shared by every member, sampling refused."""
        settings = set()
        for leaf, task in self.leaves.items():
            kwargs = dict(task.get_config("generation_kwargs") or {})
            if kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0:
                raise ValueError(f"lm-eval task {leaf} samples (generation_kwargs {kwargs}); prunebench decodes greedily")
            until = kwargs.get("until") or []
            settings.add((tuple([until] if isinstance(until, str) else until),
                          int(kwargs.get("max_gen_toks", HFLM_MAX_GEN_TOKS))))
        if len(settings) > 1:
            raise ValueError(f"lm-eval {self.lm_eval_name}: its tasks stop on different strings or budgets {sorted(settings)}; "
                             f"list them as tasks of their own")
        (until, self.max_gen_toks), = settings
        self.until = list(until)

    # ---------------------------------------------------------------- what the job reads

    def _filters(self, task) -> list[str]:
        return [f.name for f in getattr(task, "_filters", [])] or ["none"]

    def leaf_metrics(self, leaf: str) -> dict[str, tuple[str, str]]:
        """{our name: (lm-eval metric, filter)} of one leaf task."""
        task = self.leaves[leaf]
        filters = self._filters(task)
        return {metric_name(m, f, filters): (m, f) for f in filters for m in task.aggregation()}

    def top_metrics(self) -> dict[str, tuple[str, str]]:
        """The metrics logged under the task's own name: a single task's, or its group's aggregates."""
        if self.lm_eval_name not in self.groups:
            return self.leaf_metrics(next(iter(self.leaves)))
        return self.group_metrics(self.lm_eval_name)

    def group_metrics(self, group: str) -> dict[str, tuple[str, str]]:
        """{our name: (metric, filter)} a group aggregates over its leaf tasks (its
        aggregate_metric_list; without a filter_list, every filter its leaves have, as Group.aggregate
        discovers them)."""
        node = self.groups[group]
        leaves = [t for t in node.get_all_tasks() if t.task_name in self.leaves]
        discovered = sorted({f for t in leaves for f in self._filters(t)})
        pairs = [(a.metric, f) for a in (node.aggregate_metric_list or [])
                 for f in (discovered if a.filter_list is None else a.filter_list)]
        filters = list(dict.fromkeys(f for _, f in pairs))
        return {metric_name(m, f, filters): (m, f) for m, f in pairs}

    @property
    def metrics(self) -> list[str]:
        return list(self.top_metrics())

    @property
    def primary(self) -> str:
        return self._primary or self.metrics[0]

    @property
    def members(self) -> list:
        return [self]

    def higher_is_better(self) -> bool:
        metric, _ = self.top_metrics()[self.primary]
        return next(iter(self.leaves.values())).higher_is_better().get(metric, True) is not False

    def data_ids(self) -> set[str]:
        """The local files read (the run's inputs); a hub dataset by its id and config."""
        return set(self.local.read) | self.local.hub

    # ---------------------------------------------------------------- requests and scoring

    def instances(self, limit: int | None = None) -> list[LmEvalDocument]:
        """Every leaf's requests as lm-eval builds them (`limit` documents per leaf, lm-eval's
        --limit), one Document per lm-eval document, numbered across the leaves."""
        from lm_eval.evaluator_utils import get_sample_size

        documents = []
        chat = self.chat.lm_eval_options() if self.chat is not None else {}  # lm-eval's own prompt assembly
        for leaf, task in self.leaves.items():
            with contextlib.redirect_stderr(io.StringIO()), templates_compiled_once():  # stderr: its per-task bar
                task.build_all_requests(limit=get_sample_size(task, limit), rank=0, world_size=1, **chat)
            by_doc = defaultdict(list)
            for inst in task.instances:
                by_doc[inst.doc_id].append(inst)
            for doc_id in sorted(by_doc):
                group = sorted(by_doc[doc_id], key=lambda i: i.idx)
                documents.append(LmEvalDocument(len(documents), [self._request(i) for i in group], group[0].doc,
                                                task=leaf, task_doc_id=doc_id, instances=group))
        return documents

    @staticmethod
    def _request(instance):
        kind, args = instance.request_type, instance.arguments
        if kind == "loglikelihood":
            return Loglikelihood(*args)
        if kind == "loglikelihood_rolling":
            return RollingText(args[0])
        return GenerateUntil(args[0])

    def process_results(self, document: LmEvalDocument, responses: list) -> dict:
        """Responses set on lm-eval's Instances as HFLM returns them ((log-likelihood, is_greedy),
        a rolling sum, a text), then lm-eval's filters and process_results, per filter."""
        with templates_compiled_once():
            return self._process_results(self.leaves[document.task], document, responses)

    def _process_results(self, task, document: LmEvalDocument, responses: list) -> dict:
        for inst, response in zip(document.instances, responses):
            inst.resps = [self._lm_eval_response(inst.request_type, response)]
            inst.filtered_resps = {}
        for ensemble in getattr(task, "_filters", []):
            ensemble.apply(document.instances)
        names = self.leaf_metrics(document.task)
        means = {m for m, fn in task.aggregation().items() if getattr(fn, "__name__", "") == "mean"}
        record = {"doc_id": document.doc_id, "task": document.task, "task_doc_id": document.task_doc_id,
                  "target": _plain(task.doc_to_target(document.doc)),
                  "resps": [_plain(inst.resps[0]) for inst in document.instances], "items": {}}
        for filter_name in self._filters(task):
            values = task.process_results(document.doc, [inst.filtered_resps[filter_name] for inst in document.instances])
            record[f"filtered_resps_{filter_name}"] = [_plain(inst.filtered_resps[filter_name]) for inst in document.instances]
            for ours, (metric, f) in names.items():
                if f == filter_name and metric in values:
                    # a metric that is the mean of per-document values carries the document's value under
                    # its name (stability intervals, flips and McNemar read it); another aggregation's item
                    # (a log-likelihood for perplexity, a (gold, pred) pair for F1) is no such value
                    (record if metric in means else record["items"])[ours] = _plain(values[metric])
        return record

    def document_values(self, records: list[dict]) -> tuple[str, dict]:
        """The primary metric per document, with lm-eval's aggregation of it: a mean's values as they
        are; a perplexity's or bits per byte's log-likelihood items as NLL (and their word or byte
        count), which a resample pools as lm-eval does. A group's number, or another aggregation
        (F1, MCC, BLEU), gives no per-document values."""
        if self.lm_eval_name in self.groups or not records:
            return "mean", {}
        leaf = next(iter(self.leaves))
        metric, _ = self.leaf_metrics(leaf)[self.primary]
        aggregation = getattr(self.leaves[leaf].aggregation().get(metric), "__name__", "")
        if aggregation == "mean":
            return "mean", {r["doc_id"]: float(r[self.primary]) for r in records}
        if aggregation in ("weighted_perplexity", "bits_per_byte"):
            return aggregation, {r["doc_id"]: (-r["items"][self.primary][0], r["items"][self.primary][1]) for r in records}
        if aggregation == "perplexity":
            return aggregation, {r["doc_id"]: -r["items"][self.primary] for r in records}
        return "mean", {}

    @staticmethod
    def _lm_eval_response(kind: str, response):
        if kind == "loglikelihood":
            return (response.loglikelihood, response.is_greedy)
        if kind == "loglikelihood_rolling":
            return response.loglikelihood
        return response

    def corpus_metrics(self, records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
        """lm-eval's own aggregation of the records (evaluator_utils._process_results: each leaf's
        aggregations and stderrs, then the groups bottom-up, MMLU weighted by size): the task's
        values and stderrs by metric, members' as `<member>/<metric>` and `<member>/<metric>_stderr`."""
        from lm_eval.evaluator_utils import _process_results

        # lm-eval's bootstrap forks a process pool unless this is set: forking a process that holds
        # torch's threads can hang, and its single-process loop draws the same seeded resamples
        os.environ.setdefault("DISABLE_MULTIPROC", "1")
        accumulated = {leaf: {"task": task, "raw_metrics": defaultdict(list), "logged_samples": []}
                       for leaf, task in self.leaves.items()}
        # in lm-eval's order (by document): the bootstrap draws resamples by position
        for record in sorted(records, key=lambda r: r["doc_id"]):
            raw = accumulated[record["task"]]["raw_metrics"]
            for ours, key in self.leaf_metrics(record["task"]).items():
                value = record.get(ours, record["items"].get(ours))
                if value is not None:
                    raw[key].append(_lm_eval_value(value))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its bootstrap's chatter
            results = _process_results(accumulated, self.groups, self.bootstrap_iters).metrics
        values, stderrs = {}, {}
        for name, result in results.items():
            names = self.top_metrics() if name == self.lm_eval_name else (
                self.leaf_metrics(name) if name in self.leaves else self.group_metrics(name))
            for ours, (metric, f) in names.items():
                if f"{metric},{f}" not in result:
                    continue
                value, stderr = _float(result[f"{metric},{f}"]), _float(result.get(f"{metric}_stderr,{f}"))
                if name == self.lm_eval_name:
                    values[ours], stderrs[ours] = value, stderr
                else:
                    values[f"{name}/{ours}"], values[f"{name}/{ours}_stderr"] = value, stderr
        return values, stderrs


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):  # lm-eval's "N/A" stderr
        return math.nan


def _plain(value):
    """JSON-ready (numpy scalars, tuples) for predictions/<task>.jsonl."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def _lm_eval_value(value):
    """A record's value as lm-eval's aggregation expects it (its tuples came back as lists)."""
    return tuple(value) if isinstance(value, list) else value
