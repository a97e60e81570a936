"""HellaSwag: lm-eval's preprocessing, and readers for the release's jsonl (the hub's
schema) and for llama.cpp's text copy.

llama.cpp's `hellaswag_val_full.txt` (6 lines per item: "activity_label: ctx", the gold index, four
endings) lost the boundary between ctx_a and ctx_b, so lm-eval's capitalisation of ctx_b cannot be
redone, and it had stripped only some bracket tags. Read through the same preprocessing, its scores
come close to lm-eval's but are not expected to equal them."""

from __future__ import annotations

import bz2
import re
from pathlib import Path

from prunebench.tasks.sources import read_records


def preprocess(text: str) -> str:
    """lm-eval's order matters: the two-space replace is one non-overlapping pass."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def process_docs(docs: list[dict]) -> list[dict]:
    return [{**doc,
             "query": preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize()),
             "choices": [preprocess(ending) for ending in doc["endings"]],
             "gold": int(doc["label"])} for doc in docs]


def llamacpp_doc(ind: int, query: str, label: int, endings: list[str]) -> dict:
    """The whole context goes into ctx_a (ctx_b empty), so preprocessing sees the same joined text."""
    activity_label, _, ctx = query.partition(": ")
    return {"ind": ind, "activity_label": activity_label, "ctx_a": ctx, "ctx_b": "", "endings": endings,
            "label": label}


def read_llamacpp_text(path: Path) -> list[dict]:
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{path}: {len(lines)} lines is not a multiple of 6 (llama.cpp's HellaSwag format)")
    return [llamacpp_doc(i // 6, lines[i], int(lines[i + 1]), lines[i + 2:i + 6]) for i in range(0, len(lines), 6)]


def read(path: Path) -> list[dict]:
    """The release's hellaswag_val.jsonl or the hub's schema (ctx_a, ctx_b, endings, label), or
    llama.cpp's copy: its .txt(.bz2), or a jsonl view of it (query, endings, label)."""
    if ".txt" in path.suffixes:
        return read_llamacpp_text(path)
    docs = read_records(path)
    if docs and "ctx_a" not in docs[0] and "query" in docs[0]:
        return [llamacpp_doc(doc.get("ind", i), doc["query"], int(doc["label"]), doc["endings"])
                for i, doc in enumerate(docs)]
    return docs
