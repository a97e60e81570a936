"""Documents that are legal but most likely a mistake, warned about (one line per task) while a task
is checked, before any model loads: two documents with one id (a file read twice, or joined from
overlapping parts: each copy is scored and counted), and a document asking one request twice (a
choice listed twice: the scorer takes the first of equal log-likelihoods, so a gold answer on the
later copy is never predicted)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# the fields the benchmarks' files name their documents by (ARC's and CSQA's id, GLUE's idx,
# HellaSwag's ind, WinoGrande's qID), the first of them a document set has
ID_FIELDS = ("id", "idx", "doc_id", "question_id", "qID", "ind")
SHOWN = 3


def warn_duplicate_ids(task: str, docs, where: str) -> None:
    """`docs`: a list of dicts or an HF dataset (its id column read alone)."""
    columns = docs.column_names if hasattr(docs, "column_names") else (docs[0].keys() if len(docs) else ())
    key = next((name for name in ID_FIELDS if name in columns), None)
    if key is None:
        return
    values = list(docs[key]) if hasattr(docs, "column_names") else [doc.get(key) for doc in docs]
    first: dict[str, int] = {}
    repeats = []
    for index, value in enumerate(values):
        if value is None:
            continue
        earlier = first.setdefault(repr(value), index)
        if earlier != index:
            repeats.append(f"{value!r} at documents {earlier} and {index}")
    if repeats:
        log.warning("task %s: %d document(s) of %s repeat the %r of an earlier one (%s%s); each copy is scored and "
                    "counted: remove the repeats if the file was read or joined twice", task, len(repeats), where, key,
                    "; ".join(repeats[:SHOWN]), ", ..." if len(repeats) > SHOWN else "")


def warn_repeated_choices(task: str, documents, where: str) -> None:
    """`documents`: api.requests.Document, whose requests are its choices, in order."""
    repeats = []
    for document in documents:
        # a choice is its continuation; in a "multiple input" task (WinoGrande) its context
        shared_context = len({request.context for request in document.requests}) == 1
        seen: dict[tuple, int] = {}
        for index, request in enumerate(document.requests):
            earlier = seen.setdefault((request.context, request.continuation), index)
            if earlier != index:
                choice = request.continuation.strip() if shared_context else request.context[-60:]
                repeats.append(f"document {document.doc_id}: choices {earlier} and {index} are both {choice!r}")
                break
    if repeats:
        log.warning("task %s: %d document(s) of %s list a choice twice (%s%s); the first of equal scores is "
                    "predicted, so a gold answer on a later copy never is", task, len(repeats), where,
                    "; ".join(repeats[:SHOWN]), ", ..." if len(repeats) > SHOWN else "")
