"""WinoGrande's partial scoring, as lm-eval's winogrande task does it: the two options
fill the blank in two contexts, and both are scored on the same continuation, the sentence after
the blank. doc_to_text returning the gold index is what makes the task "multiple input"."""

from __future__ import annotations


def doc_to_text(doc: dict) -> int:
    return {"1": 0, "2": 1}[doc["answer"]]


def doc_to_target(doc: dict) -> str:
    return doc["sentence"][doc["sentence"].index("_") + 1:].strip()


def doc_to_choice(doc: dict) -> list[str]:
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + option for option in (doc["option1"], doc["option2"])]
