"""AI2's question format, in which ARC, OpenBookQA and CommonsenseQA were released
(`{"id", "question": {"stem", "choices": [{"label", "text"}], ...}, "answerKey"}`), read into the
hub's schema (`choices: {"text": [...], "label": [...]}`) that lm-eval's templates address. Files
already in the hub's schema pass through unchanged."""

from __future__ import annotations

from pathlib import Path

from prunebench.tasks.sources import read_records


def hub_schema(doc: dict, stem_field: str) -> dict:
    question = doc.get("question")
    if not isinstance(question, dict):
        return doc
    out = {key: value for key, value in doc.items() if key != "question"}
    out.update({key: value for key, value in question.items() if key not in ("stem", "choices")})
    out[stem_field] = question["stem"]
    out["choices"] = {"text": [c["text"] for c in question["choices"]],
                      "label": [c["label"] for c in question["choices"]]}
    return out


def read_question(path: Path) -> list[dict]:
    """ARC and CommonsenseQA: the stem becomes `question` (CSQA keeps `question_concept` beside it)."""
    return [hub_schema(doc, "question") for doc in read_records(path)]


def read_question_stem(path: Path) -> list[dict]:
    """OpenBookQA: the stem becomes `question_stem`."""
    return [hub_schema(doc, "question_stem") for doc in read_records(path)]
