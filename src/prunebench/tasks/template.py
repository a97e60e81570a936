"""How lm-eval turns a task's doc_to_text / doc_to_choice / doc_to_target into values.

A value that names a document field returns that field verbatim; anything else is a Jinja2 template
(StrictUndefined, keep_trailing_newline as in lm-eval >= 0.4.4); `py:module.function` calls Python,
for the few tasks whose preprocessing is code in lm-eval too (HellaSwag, WinoGrande)."""

from __future__ import annotations

import ast
from functools import lru_cache
from importlib import import_module
from typing import Any, Callable

import jinja2
from jinja2.sandbox import SandboxedEnvironment

# sandboxed: a task file from elsewhere can format documents but not reach Python's internals
_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


@lru_cache(maxsize=None)
def _compiled(template: str) -> jinja2.Template:
    return _ENV.from_string(template)


def import_callable(dotted: str) -> Callable:
    module, _, attr = dotted.rpartition(".")
    try:
        return getattr(import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {dotted!r}: {err}") from err


def resolve(spec: Any, doc: dict) -> Any:
    if isinstance(spec, str) and spec.startswith("py:"):
        return import_callable(spec[3:])(doc)
    if isinstance(spec, str) and spec in doc:
        return doc[spec]
    if isinstance(spec, str):
        return _compiled(spec).render(**doc)
    if isinstance(spec, (list, int)):
        return spec
    raise TypeError(f"unsupported template value {spec!r}")


def resolve_choices(spec: Any, doc: dict) -> list[str]:
    """A list; anything else (a string or number where the list belongs) raises ValueError saying
    what was found, for the task to name the document."""
    value = resolve(spec, doc)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)  # a rendered "{{choices.text}}" is a list's repr
        except (ValueError, SyntaxError):
            pass
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"doc_to_choice={spec!r} gave {value!r} ({type(value).__name__}), not a list of choices; "
                         f"the field must hold a JSON list, such as \"choices\": [\"4\", \"5\"]")
    return list(value)


def resolve_target(spec: Any, doc: dict) -> int | str:
    value = resolve(spec, doc)
    if isinstance(value, str) and value.isdigit():
        return ast.literal_eval(value)
    return value


def gold_index(target: int | str, choices: list[str]) -> int:
    """String targets are looked up in the choices; none of them gives -100, lm-eval's value for it
    (which lm-eval scores as wrong; MultipleChoiceTask refuses such a document instead)."""
    if isinstance(target, str):
        return choices.index(target) if target in choices else -100
    return target if 0 <= target < len(choices) else -100
