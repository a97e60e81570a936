"""A job's identity: a hash of what determines its numbers, not of where or how it ran."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from dataclasses import dataclass

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, flag_override, open_dict

from prunebench.api.errors import ConfigError
from prunebench.api.model_keys import PLANNING_KEYS, run_dtype
from prunebench.api.task_keys import chosen_definition
from prunebench.cache import content_key

IDENTITY, RUNTIME = "identity", "runtime"
ABSENT = object()


@dataclass(frozen=True)
class Field:
    """One config field's part in a run's identity. `role`: IDENTITY (it can change the numbers) or
    RUNTIME (where or how fast a job runs, never its numbers: left out). `since`: for an identity
    field added after runs were stored, what those runs computed; at that value it is left out, so
    they keep their keys. A `*` in `path` stands for any key (each task of a suite)."""

    path: str
    role: str = IDENTITY
    since: object = ABSENT


# The run key's contract: every root key is declared here (`undeclared` refuses one that is not), and
# each field that is not the whole of an identity root key's value. The report reads the runtime
# fields from here too (report/table.py). Adding a field: declare it, with `since` if runs stored
# before it should keep their keys; tests/golden/run_keys.json pins the keys that must not move.
CONTRACT = (
    # what the job evaluates and how: the numbers
    *(Field(key) for key in ("model", "pruner", "sparsity", "sparsity_type", "task", "calib", "eval", "limit",
                             "seed", "data_dir", "bench", "recovery", "finetuned", "mop_run", "experiment")),
    # where it runs and is recorded, how it is shown; `vision_data` and `judge` reach the numbers only by
    # interpolation into task fields, which are keyed; `export`: a copy written after the numbers are made;
    # `pruning`: where the blocks wait while pruned (onloaded or not, the same weights bit for bit)
    *(Field(key, RUNTIME) for key in ("tracking", "trainer", "hydra", "fail_fast", "plan", "detach", "vision_data",
                                      "judge", "export", "pruning")),
    Field("model.device", RUNTIME), Field("model.device_map", RUNTIME),
    *(Field(f"model.{key}", RUNTIME) for key in PLANNING_KEYS),
    Field("eval.batch_tokens", RUNTIME),
    Field("recovery.checkpoint_every", RUNTIME),
    # how to reach a task's judge, not which model grades
    *(Field(f"task.tasks.*.judge.{key}", RUNTIME)
      for key in ("url", "api_key_env", "max_retries", "timeout_s", "device", "name")),
    # added after runs were stored, at what those runs did
    Field("pruner.tower", since="language"),
    Field("pruner.norm_sum", since="float64"),
    Field("recovery.loss_scaling", since="micro_batches"),
    Field("recovery.windows", since="random"),
    Field("recovery.schedule_steps", since=None),
    Field("recovery.allow_eval_split", since=False),
    Field("task.tasks.*.judge.repeats", since=1),
    Field("task.tasks.*.judge.max_failure_rate", since=0.05),
)
RUNTIME_PATHS = tuple(f.path for f in CONTRACT if f.role == RUNTIME)
ROOT_KEYS = frozenset(f.path for f in CONTRACT if "." not in f.path)
DENSE_PRUNER = {"_target_": "prunebench.pruners.base.NoPruner", "name": "none"}
DENSE_VALUES = {"pruner": DENSE_PRUNER, "sparsity": 0.0}  # what makes a job its dense baseline


def is_dense(cfg: DictConfig) -> bool:
    return cfg.pruner.name == "none" or float(cfg.sparsity) == 0.0


def recovering(cfg: DictConfig) -> bool:
    """A recovery fine-tune is configured (recovery=none, or a config from before the group, has none)."""
    return OmegaConf.select(cfg, "recovery.name", default="none") != "none"


def identity(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> dict:
    """`inputs`: the digests of the local data the job reads ({context: {path: digest}}, inputs.py),
    so a changed file is a new run; calibration data counts only where calibration does. The root
    `seed` reaches the numbers only through the fields that interpolate it (a random pruner's, a
    calibration's, the latency prompt's): where none is left (a dense run, a magnitude pruner), it is
    no part of the identity, so `seed=0,1` evaluates the dense model once."""
    data = fields(cfg, inputs)
    if "seed" in data:
        with values_set(cfg, {"seed": f"{cfg.seed}-probe"}) as other:  # any other value: what resolves from it changes with it
            probe = fields(other, inputs)
        if {k: v for k, v in probe.items() if k != "seed"} == {k: v for k, v in data.items() if k != "seed"}:
            data.pop("seed")
    return data


@contextmanager
def values_set(cfg: DictConfig, values: dict) -> Iterator[DictConfig]:
    """`cfg` with these root values inside the block and as it was after it: set in place, since a
    deep copy of a job's config costs as much as resolving it (a plan keys each job, with a seed probe,
    and its dense baseline); where one of them is written as an interpolation, set on a copy
    (`with_values`), so that it stays written as it was."""
    if any(OmegaConf.is_interpolation(cfg, key) for key in values):
        yield with_values(cfg, values)
        return
    before = {key: cfg[key] for key in values}
    with flag_override(cfg, ["readonly", "struct"], False):
        for key, value in values.items():
            cfg[key] = value
        try:
            yield cfg
        finally:
            for key, value in before.items():
                cfg[key] = value


def with_values(cfg: DictConfig, values: dict) -> DictConfig:
    """A copy of `cfg` with these root values."""
    other = copy.deepcopy(cfg)
    with open_dict(other):
        for key, value in values.items():
            other[key] = value
    return other


def undeclared(cfg: DictConfig) -> list[str]:
    """Root keys the contract does not declare (a lab's config may add one): they are keyed, as
    anything that may change the numbers is. tests/tracking/test_run_key.py holds every root key of
    prunebench's own configs declared."""
    return sorted(str(key) for key in cfg if key not in ROOT_KEYS)


def check_added_keys(cfg: DictConfig, overrides: list[str]) -> None:
    """`+key=value` adds a root key no config defines (Hydra's own suggestion after a typo,
    `+sparsty=0.3`), which nothing reads: the job would run at the default. A config group added so
    (`+lab_group=option`), or a root key a lab's config defines, is not refused."""
    for line in overrides:
        key = line.split("=", 1)[0].removeprefix("+")
        if line.startswith("+") and not line.startswith("++") and key not in ROOT_KEYS and key in cfg \
                and not isinstance(cfg.get(key), DictConfig):
            close = difflib.get_close_matches(key, sorted(ROOT_KEYS), n=3)
            raise ConfigError(f"{line}: the config defines no root key {key!r}, so nothing would read it"
                              + (f"; did you mean {' or '.join(map(repr, close))} (set it without +)?" if close else ""))


def fields(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None) -> dict:
    """The resolved config without what never changes a job's numbers (`CONTRACT`)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    # a benchmark chosen for calibration or recovery (task@calib.task=NAME) is keyed by its one
    # definition, what the job reads: runs stored when that definition was selected alone keep their keys
    for owner in ("calib", "recovery"):
        node = data.get(owner)
        if isinstance(node, dict) and isinstance(node.get("task"), dict):
            with suppress(ValueError):  # a suite chosen there is refused by validation, not here
                node["task"] = OmegaConf.to_container(chosen_definition(node["task"], f"{owner}.task"))
    if "dtype" in data.get("model", {}):
        data["model"]["dtype"] = run_dtype(cfg.model)
    for field in CONTRACT:
        if field.role == RUNTIME or field.since is not ABSENT:
            drop(data, field.path.split("."), field)
    evaluation = data.get("eval", {})
    # the fast scorer is what ran before eval.numerics existed, and its batch size is lm-eval's alone
    if evaluation.get("numerics") == "fast":
        evaluation.pop("numerics")
        evaluation.pop("lm_eval_batch_size", None)
    # raw prompts are what every run did before the chat options existed: runs stored then still match
    for key, default in (("chat_template", False), ("fewshot_as_multiturn", False), ("system_instruction", None)):
        if key in evaluation and evaluation[key] is default:
            evaluation.pop(key)
    task = data.get("task", {})
    # only the protocol that runs decides the numbers: OpenCompass's versions leave lm-eval runs alone
    offered = task.pop("protocols", None) or {}
    if task.get("protocol") in offered:
        task["protocols"] = {task["protocol"]: offered[task["protocol"]]}
    # no recovery is what every run did before the group existed, and a dense model is not recovered
    # (the papers' baseline): runs stored then, and dense baselines, keep their keys
    if not recovering(cfg) or is_dense(cfg):
        data.pop("recovery", None)
    if is_dense(cfg):
        data["pruner"] = dict(DENSE_PRUNER)
        data["sparsity"] = 0.0
    if is_dense(cfg) or not get_class(data["pruner"]["_target_"]).needs_calibration:
        data.pop("calib", None)
    read = {context: files for context, files in (inputs or {}).items()
            if (context != "calib" or "calib" in data) and (context != "recovery" or "recovery" in data)}
    if read:  # a job reading only hub datasets keeps the key it had before inputs were keyed
        data["inputs"] = read
    return data


def drop(node, path: list[str], field: Field) -> None:
    """Leaves `field` out of the resolved config `node` at `path`: a runtime field always, an identity
    field at its `since` value."""
    if not isinstance(node, dict):
        return
    head, rest = path[0], path[1:]
    for key in (list(node) if head == "*" else [head] if head in node else []):
        if rest:
            drop(node[key], rest, field)
        elif field.role == RUNTIME or node[key] == field.since:
            node.pop(key)


def run_key(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> str:
    return content_key(identity(cfg, inputs))


def dense_config(cfg: DictConfig) -> DictConfig:
    return with_values(cfg, DENSE_VALUES)


def dense_key(cfg: DictConfig, inputs: dict[str, dict[str, str]] | None = None) -> str:
    """The run key of `dense_config(cfg)`, keyed on `cfg` itself with the dense values set for the while."""
    with values_set(cfg, DENSE_VALUES) as dense:
        return run_key(dense, inputs)
