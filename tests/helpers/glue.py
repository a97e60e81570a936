"""GLUE files in the release's layout (header, column order, label spelling), of random sentences."""

from __future__ import annotations

import random

WORDS = "good bad fine awful great terrible movie plot acting the a was is \"odd".split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


def glue_tsv(task: str, n: int, seed: int = 0) -> str:
    """A file in the release's layout for `task` (header, column order, label spelling)."""
    rng = random.Random(seed)
    s = lambda: sentence(rng)  # noqa: E731
    rows = {
        "sst2": lambda i: [s(), str(rng.randint(0, 1))],
        "cola": lambda i: ["gj04", str(b := rng.randint(0, 1)), "" if b else "*", s()],
        "mrpc": lambda i: [str(rng.randint(0, 1)), str(i), str(i + 1), s(), s()],
        "qqp": lambda i: [str(i), str(2 * i), str(2 * i + 1), s(), s(), str(rng.randint(0, 1))],
        "stsb": lambda i: [str(i), "main-captions", "MSRvid", "2012test", str(i), "none", "none", s(), s(),
                           f"{rng.uniform(0, 5):.3f}"],
        "qnli": lambda i: [str(i), s(), s(), rng.choice(["entailment", "not_entailment"])],
        "mnli": lambda i: [str(i), "1", "1e", "fiction", "(x)", "(y)", "(ROOT x)", "(ROOT y)", s(), s(),
                           *(rng.choice(["entailment", "neutral", "contradiction"]),) * 2],
        "rte": lambda i: [str(i), s(), s(), rng.choice(["entailment", "not_entailment"])],
    }[task]
    headers = {
        "sst2": ["sentence", "label"], "cola": None,
        "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        "stsb": ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                 "score"],
        "qnli": ["index", "question", "sentence", "label"],
        "mnli": ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
        "rte": ["index", "sentence1", "sentence2", "label"],
    }
    lines = ([headers[task]] if headers[task] else []) + [rows(i) for i in range(n)]
    return "\ufeff" * (task == "mrpc") + "".join("\t".join(r) + "\n" for r in lines)
