"""ScienceQA-IMG from LLaVA's prompt file (`llava_test_CQM-A.json`): its human turn is
"<image>\\nContext: {hint}\\n{question}\\n{A. ...\\nB. ...}", the text lmms-eval's scienceqa_img
builds from the hub's fields, so the prompt is that turn without the image tag plus lmms-eval's
post-prompt. Scored both ways: lmms-eval's `exact_match` and LLaVA's parser (`llava_acc`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from prunebench.tasks.generate_until import GenerateUntilTask, Request, TakeFirst
from prunebench.tasks.sources import JsonSource
from prunebench.tasks.vqa import llava_scienceqa_answer, scienceqa_exact_match

POST_PROMPT = "\nAnswer with the option's letter from the given choices directly."
_OPTION = re.compile(r"^[A-Z]\. ")


def read_img(path: Path) -> list[dict]:
    """The questions with an image (LLaVA's IMG subset), each with its prompt, gold letter and number of choices."""
    docs = []
    for item in JsonSource(str(path)).load():
        if "image" not in item:
            continue
        human, gold = item["conversations"][0]["value"], item["conversations"][1]["value"]
        text = human.removeprefix("<image>\n")
        lines = text.split("\n")
        n_choices = 0
        while n_choices < len(lines) and _OPTION.match(lines[len(lines) - 1 - n_choices]):
            n_choices += 1
        docs.append({"id": item["id"], "image": item["image"], "text": text, "answer": gold, "n_choices": n_choices})
    return docs


def prompt(doc: dict) -> str:
    return doc["text"] + POST_PROMPT


@dataclass
class ScienceQATask(GenerateUntilTask):
    filters: dict = field(default_factory=lambda: {"exact_match": TakeFirst(), "llava_acc": TakeFirst()})

    def score(self, response: str, request: Request) -> tuple[dict[str, str], dict[str, float]]:
        """`llava_acc` parses the reply as LLaVA's pipeline sees it: model_vqa_science.py strips the
        decoded reply before writing it, so ' B' reads B, and 'B. ' becomes 'B.', which is FAILED."""
        target = request.target
        llava = llava_scienceqa_answer(response.strip(), request.doc["n_choices"])
        return ({"exact_match": response.strip(), "llava_acc": llava},
                {"exact_match": scienceqa_exact_match(response, target), "llava_acc": float(llava == target)})
