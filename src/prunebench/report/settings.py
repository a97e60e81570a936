"""What one table or one plot may hold: runs that agree on everything their numbers rest on besides
the pruner and its ratio. Two runs of one model on ARC-Easy, one over 30 documents and one over
all, or one at bf16 and one at fp32, give numbers no reader may average or join with a line; so a
report splits its runs by `setting` and heads each table and panel with it, in the words a user
would type to get the same numbers again (`limit=30`, `data=arc/ARC-Easy-Test.jsonl@ab12`)."""

from __future__ import annotations

import json

import pandas as pd

# model, task set, documents, data, numbers' dtype, how log-likelihoods were computed, whose prompts,
# and in which chat format (a chat template or raw prompts: evaluation/chat.py)
SETTING_KEYS = ("model", "task", "limit", "data", "dtype", "numerics", "protocol", "chat")
# a run logged before a setting existed ran what is now its default
DEFAULTS = {"numerics": "fast", "protocol": "lm_eval", "limit": "null", "chat": "none"}


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def setting(run: pd.Series) -> dict[str, str]:
    """The run's value of each of SETTING_KEYS; '' where the run read nothing local (`data`: hub
    datasets) or the model has no dtype."""
    task = run["tags.prunebench.task"]
    tasks = sorted(json.loads(_text(run.get("tags.prunebench.avg_metrics")) or "{}"))
    limit = _text(run.get("params.limit"))
    values = {
        "model": run["tags.prunebench.model"],
        # a suite's name alone does not say which of its tasks ran (`~task.tasks.hellaswag` drops one)
        "task": task if tasks in ([], [task]) else f"{task} ({', '.join(tasks)})",
        "limit": "null" if limit in ("", "None") else limit,
        "data": _text(run.get("tags.prunebench.data")),
        "dtype": _text(run.get("tags.prunebench.dtype")) or _text(run.get("params.model.dtype")),
        "numerics": _text(run.get("params.eval.numerics")),
        "protocol": _text(run.get("tags.prunebench.protocol")),
        "chat": chat_setting(run),
    }
    return {key: value or DEFAULTS.get(key, "") for key, value in values.items()}


def heading(values: dict[str, str]) -> str:
    """`model · key=value · ...`, the keys with a value, in SETTING_KEYS' order."""
    named = [f"{key}={values[key]}" for key in SETTING_KEYS if key != "model" and values.get(key)]
    return " · ".join([values["model"], *named] if values.get("model") else named)


def settings(runs: pd.DataFrame, keys: tuple[str, ...] = SETTING_KEYS) -> pd.Series:
    """Each run's heading over `keys` (fewer than all where a table pools models on purpose)."""
    return runs.apply(lambda run: heading({k: v for k, v in setting(run).items() if k in keys}), axis=1) \
        if not runs.empty else pd.Series([], dtype=str)


def chat_setting(run: pd.Series) -> str:
    """`template` (a NAME: `template:NAME`), or `none` for raw prompts, with `+multiturn` and
    `+system@<digest>` where those ran: the chat options as the run logged them (MLflow's strings)."""
    from prunebench.api.chat_format import ChatFormat

    def param(key: str) -> str:
        return _text(run.get(f"params.eval.{key}"))

    template = param("chat_template")
    system = param("system_instruction")
    return ChatFormat(template=template == "True" or (template not in ("", "True", "False") and template),
                      multiturn=param("fewshot_as_multiturn") == "True",
                      system=None if system in ("", "None") else system).label()
