"""Readers for benchmark files in the formats their authors released (or the copies labs keep),
turning them into the schema of the hub dataset lm-eval's task reads, so lm-eval's own templates
address them unchanged. lm-eval has none of these: it reads the hub only."""

from __future__ import annotations

import csv
from pathlib import Path

from prunebench.tasks.sources import read_records, read_utf8

_BOOLS = {"true": 1, "false": 0, True: 1, False: 0}  # 1 and 0 are the keys True and False


def superglue_boolq(path: Path) -> list[dict]:
    """SuperGLUE's BoolQ val.jsonl (question, passage, idx, label); copies re-serialised by
    OpenCompass carry the label as the string "true"/"false", the hub as a class index (False=0)."""
    docs = read_records(path)
    for i, doc in enumerate(docs):
        if doc.get("label") not in _BOOLS:
            raise ValueError(f"{path}, document {i}: label {doc.get('label')!r} is not true/false or 0/1")
    return [{**doc, "label": _BOOLS[doc["label"]]} for doc in docs]


_RTE_LABELS = {"entailment": 0, "not_entailment": 1, 0: 0, 1: 1}


def superglue_rte(path: Path) -> list[dict]:
    """SuperGLUE's RTE val.jsonl (premise, hypothesis, label "entailment"/"not_entailment") in GLUE's
    hub schema (sentence1, sentence2, label 0 = entailment), which lm-eval's `rte` reads. SuperGLUE
    dropped the surrounding quote marks of six GLUE texts; the labels agree."""
    out = []
    for i, doc in enumerate(read_records(path)):
        if "sentence1" in doc:
            out.append(doc)
            continue
        if doc.get("label") not in _RTE_LABELS:
            raise ValueError(f"{path}, document {i}: label {doc.get('label')!r} is not entailment/not_entailment")
        out.append({"sentence1": doc["premise"], "sentence2": doc["hypothesis"], "label": _RTE_LABELS[doc["label"]],
                    "idx": doc.get("idx", i)})
    return out


def mmlu_csv(path: Path) -> list[dict]:
    """Hendrycks' MMLU CSV (<subject>_<split>.csv: no header; question, four choices, answer letter)
    in cais/mmlu's schema; the subject is the file's name without the split."""
    subject = path.stem.rsplit("_", 1)[0]
    docs = []
    with path.open(encoding="utf-8", newline="") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if len(row) != 6 or row[5] not in "ABCD" or not row[5]:
                raise ValueError(f"{path}, line {line}: expected question, 4 choices and an answer letter A-D; "
                                 f"got {len(row)} fields ending {row[-1:]!r}")
            docs.append({"question": row[0], "subject": subject, "choices": row[1:5], "answer": "ABCD".index(row[5])})
    return docs


def _is_page_title(line: str) -> bool:
    return line.startswith(" = ") and not line.startswith(" = = ") and line.rstrip().endswith(" =")


def wikitext_pages(path: Path) -> list[dict]:
    """A raw WikiText file (wiki.test.raw) as EleutherAI/wikitext_document_level's pages: a page
    starts at each level-1 heading line (" = Title = "). The blank line before the first heading
    belongs to no page, as in that dataset (tests check the pages rebuild the file byte for byte)."""
    lines = read_utf8(path).split("\n")
    pages, current = [], []
    for line in lines:
        if _is_page_title(line) and current:
            pages.append(current)
            current = []
        current.append(line)
    pages.append(current)
    texts = ["\n".join(page) for page in pages]
    if texts and not _is_page_title(texts[0].split("\n", 1)[0]):
        texts = texts[1:]
    return [{"page": text} for text in texts]
