"""BIG-Bench-Hard: 27 generate_until subtasks in one table, as lm-eval runs them (bbh_zeroshot,
bbh_fewshot, bbh_cot_fewshot) or as OpenCompass does (3-shot CoT `bbh_gen`, zero-shot
`bbh_0shot_nocot_gen`). The subtasks are data (bbh_subtasks.yaml); this module holds the
answer filters that table names and how a variant builds a member task from an entry.

The answer filters re-implement lm-eval 0.4.13's (`lm_eval/tasks/bbh/zeroshot/utils.py`,
`filters/extraction.py`) and OpenCompass's post-processors (`opencompass/datasets/bbh.py`) rule for
rule; tests/tasks/test_bbh_conformance.py holds them to lm-eval's on recorded generations."""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from prunebench.tasks import bigbench_sdist
from prunebench.tasks.generate_until import ExactMatch, GenerateUntilTask, Regex, TakeFirst, TaskGroup
from prunebench.tasks.sources import BenchmarkSource, DocSource, read_records

INVALID = "[invalid]"


@lru_cache(maxsize=1)
def _punctuation() -> dict[int, None]:
    return dict.fromkeys(i for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P"))


def _normalise(text: str) -> str:
    """Lower case without Unicode punctuation (lm-eval's ignore_case + ignore_punctuation)."""
    return text.lower().translate(_punctuation())


def _first(regex: re.Pattern, text: str) -> str:
    """The first match (of a match with groups, its first non-empty group), stripped; "" if none."""
    found = regex.findall(text)
    if not found:
        return ""
    match = found[0]
    if isinstance(match, tuple):
        match = next((m for m in match if m), "")
    return match.strip()


_LETTER = re.compile(r"(\([A-Z]\))")
_OPTION = re.compile(r"\([A-Z]\)([^\n^(]*)")


class OptionLetter:
    """lm-eval's MultiChoiceRegexFilter: the first "(X)" in the response; else the first option text
    of the question found in the response (both lower-cased, punctuation removed; longest options
    tried first), as its letter; else a letter after a colon; else "[invalid]"."""

    def __call__(self, response: str, doc: dict) -> str:
        answer = _first(_LETTER, response)
        if answer:
            return answer
        options = [_normalise(text.strip()) for text in _OPTION.findall(doc["input"])]
        letters = [chr(ord("A") + i) for i in range(len(options))]
        by_text = {text: f"({letter})" for text, letter in zip(options, letters)}
        texts = re.compile("|".join(sorted((re.escape(t) for t in options), key=len, reverse=True)))
        answer = _first(texts, _normalise(response))
        if answer:
            return by_text.get(answer, answer)
        answer = _first(re.compile(rf":[\s]*({'|'.join(letters)})"), response)
        if answer:
            return f"({answer})" if answer in letters else answer
        return INVALID


# English number phrases, lm-eval's NumberParseRegexFilter pattern (from a public regex; it needs
# the `regex` module for its branch-reset groups)
_ENGLISH_NUMBER = (
    "((?:(?:zero|one|two|three|four|five|(?:twen|thir|for|fif|six|seven|nine)(?|teen|ty)|eight(?:|een|y)|ten|eleven"
    "|twelve|fourteen|hundred|thousand|(?:m|b|tr)illion)(?:zero|one|two|three|four|five|(?:twen|thir|for|fif|six"
    "|seven|nine)(?:|teen|ty)|eight(?|een|y)|ten|eleven|twelve|fourteen|hundred|thousand|(?:m|b|tr)illion"
    "|[^\\S\r\n]|,|and|&)+)?(?:zero|one|two|three|four|five|(?:twen|thir|for|fif|six|seven|nine)(?|teen|ty)"
    "|eight(?|een|y)|ten|eleven|twelve|fourteen|hundred|thousand|(?:m|b|tr)illion))")
_DIGITS = re.compile(r"([-0-9]+)")


class NumberAnswer:
    """lm-eval's NumberParseRegexFilter: the first run of digits and minus signs; else the first
    English number phrase, as digits."""

    def __call__(self, response: str, doc: dict) -> str:
        import regex
        from word2number import w2n

        answer = _first(_DIGITS, response)
        if answer:
            return answer
        words = _first(regex.compile(_ENGLISH_NUMBER), response.lower())
        if words:
            try:
                return str(w2n.word_to_num(words))
            except ValueError:  # a phrase w2n rejects: lm-eval raises there, we score it invalid
                return INVALID
        return INVALID


@dataclass
class MappedAnswer:
    """lm-eval's MapRegexFilter (ignore_case): the first match of any pattern in the lower-cased
    response, mapped by the first pattern (in order) that matches it."""

    patterns: dict[str, str]

    def __call__(self, response: str, doc: dict) -> str:
        whole = _first(re.compile("|".join(self.patterns)), response.lower())
        if whole:
            for pattern, value in self.patterns.items():
                if _first(re.compile(pattern), whole.lower()):
                    return value
        return INVALID


class SortedWords:
    """lm-eval's WordSortFilter: the question's words found in the response, each once, in the
    order of their last occurrence."""

    def __call__(self, response: str, doc: dict) -> str:
        words = doc["input"].split("List:")[1].strip().split()
        found = re.findall("|".join(rf"\b{w}\b" for w in words), response)
        last = {word: i for i, word in enumerate(found)}
        return " ".join(sorted(last, key=last.__getitem__))


class OpenCompassOption:
    """OpenCompass's bbh_mcq_postprocess, applied to the generation and to the target alike: after
    the first "answer is ", the letter of the first "(X", else the first capital letter."""

    def __call__(self, text: str, doc: dict) -> str:
        parts = text.split("answer is ")
        if len(parts) > 1:
            text = parts[1].strip()
        match = re.search(r"\(([A-Z])\)*", text) or re.search(r"([A-Z])", text)
        return match.group(1) if match else text


class OpenCompassFreeform:
    """OpenCompass's bbh_freeform_postprocess: after the first "answer is ", the first line without
    a final period; a **bold** part if there is one. Compared to the raw target, case included."""

    def __call__(self, text: str, doc: dict) -> str:
        parts = text.split("answer is ")
        if len(parts) > 1:
            text = parts[1].strip()
        text = text.split("\n")[0].strip()
        if text.endswith("."):
            text = text[:-1].strip()
        match = re.search(r"\*\*(.*?)\*\*", text)
        return match.group(1) if match else text


@dataclass(frozen=True)
class Subtask:
    """`description`: lm-eval's (the prompt file's text before the first exemplar); `answer`: the
    flexible-extract filter of bbh_zeroshot; `bigbench`: the BIG-bench task JSON it was drawn from
    (None: a programmatic BIG-bench task, no JSON); `bigbench_answers` renames BIG-bench answers to
    BBH's."""

    description: str
    answer: object
    bigbench: str | None
    bigbench_answers: dict | None = None

    @property
    def multiple_choice(self) -> bool:
        return isinstance(self.answer, OptionLetter)


# the answer filters the subtask table names (`answer:` a name, or {name: its argument})
ANSWERS = {"option_letter": OptionLetter, "number": NumberAnswer, "sorted_words": SortedWords, "regex": Regex,
           "mapped": MappedAnswer}


def load_subtasks(path: Path = Path(__file__).with_name("bbh_subtasks.yaml")) -> dict[str, Subtask]:
    """The subtask table: a new BBH-style subtask is one entry there, not code."""
    subtasks = {}
    for name, entry in yaml.safe_load(path.read_text(encoding="utf-8")).items():
        answer = entry["answer"]
        (kind, argument), = answer.items() if isinstance(answer, dict) else [(answer, None)]
        subtasks[name] = Subtask(entry["description"], ANSWERS[kind]() if argument is None else ANSWERS[kind](argument),
                                 entry["bigbench"], entry.get("bigbench_answers"))
    return subtasks


SUBTASKS = load_subtasks()

COT_CUE = "Let's think step by step."
# lm-eval's bbh_zeroshot exact match: these removed from both strings, then case ignored
ZEROSHOT_IGNORED = [r"\.$", ",", "\n", r"\\", '"']


def read_exemplars(path: Path) -> list[dict]:
    """Few-shot exemplars as {input, answer (all after "A: "), cot (the chain of thought), target
    (its final answer)}, from an official BBH prompt file (cot-prompts/<subtask>.txt: a canary line,
    "-----", the description, then "Q: ...\\nA: Let's think step by step. ... So the answer is X.")
    or from a JSON/JSONL list in the HF schema ({input, target}, target being the chain of thought,
    as lm-eval inlines them)."""
    if path.suffix != ".txt":
        return [{"input": ex["input"], "answer": f"{COT_CUE}\n{ex['target']}", "cot": ex["target"],
                 "target": short_answer(ex["target"])} for ex in read_records(path)]
    body = path.read_text(encoding="utf-8").split("-----\n", 1)[-1]
    out = []
    for block in body.split("\n\nQ: ")[1:]:
        question, _, answer = block.partition("\nA: ")
        # the cue ends its line, except in sports_understanding where the reasoning follows a space
        cot = answer.removeprefix(COT_CUE)
        cot = cot[1:] if cot[:1] in ("\n", " ") else cot
        out.append({"input": question, "answer": answer, "cot": cot, "target": short_answer(cot)})
    if not out:
        raise ValueError(f"{path}: no 'Q: ...' exemplars found")
    return out


def short_answer(cot: str) -> str:
    match = re.search(r"So the answer is (.*)\.$", cot)
    return match.group(1) if match else cot


class BigBenchBBHSource(DocSource):
    """The BIG-bench task a subtask was drawn from, every item (BBH sampled at most 250), in BBH's
    schema: the task prefix and the input; multiple-choice subtasks list the choices as "(A) ..."
    lines after "Options:" and answer with the letter. The prompts are generic, so scores are not
    BBH's; the JSON comes from PyPI's bigbench sdist (tasks/bigbench_sdist.py)."""

    def __init__(self, subtask: str):
        self.subtask = subtask
        spec = SUBTASKS[subtask]
        if spec.bigbench is None:
            raise ValueError(f"BBH subtask {subtask!r} comes from a programmatic BIG-bench task (no task "
                             f"JSON); use source=bbh for it")
        self.spec = spec

    def check(self) -> None:
        self.task_json()  # downloads and extracts once, so a machine without the sdist fails before loading

    def task_json(self) -> Path:
        return bigbench_sdist.extract([f"{self.spec.bigbench}/task.json"])[0]

    def load(self) -> list[dict]:
        task = json.loads(self.task_json().read_text(encoding="utf-8"))
        prefix = task.get("task_prefix", "").strip()
        rename = self.spec.bigbench_answers or {}
        docs = []
        for ex in task["examples"]:
            text = f"{prefix} {ex['input'].strip()}" if prefix else ex["input"].strip()
            scores = ex.get("target_scores")
            if scores:
                choices = list(scores)
                best = choices.index(max(choices, key=scores.__getitem__))
                if self.spec.multiple_choice:
                    text += "\nOptions:\n" + "\n".join(f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(choices))
                    target = f"({chr(ord('A') + best)})"
                else:
                    target = choices[best]
            else:
                targets = ex["target"] if isinstance(ex["target"], list) else [ex["target"]]
                target = next((t for t in targets if t.lstrip("-").isdigit()), targets[0])
            docs.append({"input": text, "target": rename.get(target, target)})
        return docs

    def describe(self) -> str:
        return f"bigbench:{self.spec.bigbench}"


VARIANTS = ("zeroshot", "fewshot", "cot_fewshot")
PROTOCOLS = ("lm_eval", "opencompass")


def bbh(name: str, variant: str, protocol: str = "lm_eval", subtasks: list[str] | None = None,
        source: str = "bbh", data_dir: str | None = None, hub: str = "SaylorTwift/bbh",
        prompts_dir: str | None = None, max_gen_toks: int | None = None) -> TaskGroup:
    """The BBH group `name` with members `<name>_<subtask>`.

    source: `bbh` = BBH's items (data_dir/bbh/<subtask>.json when data_dir is set, else the hub's
    `hub` dataset), `bigbench` = the BIG-bench tasks they were drawn from. Few-shot exemplars come
    from prompts_dir/<subtask>.txt|.json|.jsonl (default data_dir/bbh/cot-prompts)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; valid: {list(VARIANTS)}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"task.protocol={protocol!r}; valid: {list(PROTOCOLS)}")
    if protocol == "opencompass" and variant == "fewshot":
        raise ValueError("OpenCompass has no plain few-shot BBH; with task.protocol=opencompass use "
                         "task=bbh_cot_fewshot (its bbh_gen) or task=bbh_zeroshot (its bbh_0shot_nocot_gen)")
    if max_gen_toks is not None and max_gen_toks < 1:
        raise ValueError(f"max_gen_toks={max_gen_toks} must be positive or null")
    if source not in ("bbh", "bigbench"):
        raise ValueError(f"source={source!r}; valid: ['bbh', 'bigbench']")
    names = list(SUBTASKS) if subtasks is None else list(subtasks)
    unknown = sorted(set(names) - set(SUBTASKS))
    if unknown:
        raise ValueError(f"unknown BBH subtasks {unknown}; valid: {list(SUBTASKS)}")
    members = []
    for sub in names:
        docs = (BigBenchBBHSource(sub) if source == "bigbench" else
                BenchmarkSource(hub=hub, split="test", name=sub, file=f"bbh/{sub}.json", data_dir=data_dir))
        shots = [] if protocol == "lm_eval" and variant == "zeroshot" else _exemplars(sub, prompts_dir, data_dir)
        build = _lm_eval_member if protocol == "lm_eval" else _opencompass_member
        task = build(f"{name}_{sub}", SUBTASKS[sub], variant, docs, shots)
        if max_gen_toks is not None:
            task.max_gen_toks = max_gen_toks
        members.append(task)
    return TaskGroup(name, members, weight_by_size=protocol == "lm_eval")


def _exemplars(sub: str, prompts_dir: str | None, data_dir: str | None) -> list[dict]:
    if prompts_dir is None and data_dir is None:
        raise FileNotFoundError("few-shot BBH needs its prompt files: set data_dir=DIR (holding "
                                "bbh/cot-prompts/<subtask>.txt) or task.tasks.<task>.prompts_dir=DIR")
    folder = Path(prompts_dir).expanduser() if prompts_dir else Path(data_dir).expanduser() / "bbh" / "cot-prompts"
    for suffix in (".txt", ".json", ".jsonl"):
        if (folder / f"{sub}{suffix}").is_file():
            return read_exemplars(folder / f"{sub}{suffix}")
    raise FileNotFoundError(f"no prompt file {str(folder / sub)!r}.txt (or .json/.jsonl) for BBH subtask {sub}")


def _lm_eval_member(name: str, spec: Subtask, variant: str, docs: DocSource, shots: list[dict]) -> GenerateUntilTask:
    if variant == "zeroshot":
        return GenerateUntilTask(name, docs, "Q: {{input}}\nA:", description=spec.description,
                                 until=["</s>", "Q:", "<|im_end|>"], max_gen_toks=256,
                                 filters={"exact_match": spec.answer, "exact_match_strict": TakeFirst()},
                                 metric=ExactMatch(ignore_case=True, regexes_to_ignore=ZEROSHOT_IGNORED))
    if variant == "fewshot":
        return GenerateUntilTask(name, docs, "Q: {{input}}\nA:", description=spec.description, fewshot=shots,
                                 until=["</s>", "Q", "\n\n"], max_gen_toks=256)
    cot_shots = [{"input": s["input"], "target": s["cot"]} for s in shots]
    return GenerateUntilTask(name, docs, f"Q: {{{{input}}}}\nA: {COT_CUE}\n", description=spec.description,
                             fewshot=cot_shots, target_delimiter="", until=["</s>", "Q", "\n\n"], max_gen_toks=1024,
                             filters={"exact_match": Regex(r"(?<=the answer is )(.*)(?=.)")})


def _opencompass_member(name: str, spec: Subtask, variant: str, docs: DocSource,
                        shots: list[dict]) -> GenerateUntilTask:
    """bbh_gen (3-shot CoT: the prompt file's text as one hint) or bbh_0shot_nocot_gen_925fc4; no
    stop strings besides EOS, 512 new tokens."""
    answer = OpenCompassOption() if spec.multiple_choice else OpenCompassFreeform()
    target = answer if spec.multiple_choice else None
    if variant == "zeroshot":
        return GenerateUntilTask(name, docs, "Question: {{input}}\n You must give your final answer by starting "
                                             "with 'So the answer is' ", max_gen_toks=512,
                                 filters={"exact_match": answer}, target_filter=target)
    hint = spec.description + "\n\n".join(f"Q: {s['input']}\nA: {s['answer']}" for s in shots)
    return GenerateUntilTask(name, docs, f"Q: {{{{input}}}}\nA: {COT_CUE}",
                             description=f"Follow the given examples and answer the question.\n{hint}\n\n",
                             max_gen_toks=512, filters={"exact_match": answer}, target_filter=target)
