"""Answer scoring of the vision-language benchmarks, as pure functions: VQA soft accuracy over the
annotators with the EvalAI answer normalisation (lmms-eval's `_task_utils/vqa_eval_metric.py`,
itself MMF's copy of the official VQA evaluation), and ScienceQA's letter parsing as lmms-eval's
`scienceqa` and LLaVA's `llava/eval/eval_science_qa.py` read a reply.

Hand-written because no installable library ships these rules; the tables are the official ones."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from prunebench.tasks.generate_until import GenerateUntilTask, Request

# the official table: an answer written without its apostrophe -> with it
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've",
    "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's",
    "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at",
    "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd", "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've",
    "someone'dve": "someone'd've", "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've",
    "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't",
    "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't", "whatll": "what'll",
    "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's",
    "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}
NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
           "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = {"a", "an", "the"}
PUNCTUATION = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
# The official pattern reads "(?!<=\d)" (a lookahead for the text "<=" + digit, a typo for a
# lookbehind): kept, so "1.5" keeps its point only because a digit follows it
PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
DIGIT_COMMA = re.compile(r"(?<=\d)(\,)+(?=\d)")


def _punctuation(text: str) -> str:
    """A mark next to a space (or any text with a digit group comma) is deleted, else it becomes a space."""
    out = text
    for mark in PUNCTUATION:
        if mark + " " in text or " " + mark in text or DIGIT_COMMA.search(text):
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    # the official call passes re.UNICODE (32) where sub() takes `count`: at most 32 periods go
    return PERIOD.sub("", out, 32)


def normalize_answer(answer: str) -> str:
    """EvalAI's answer processing: lowercase, "," "?" dropped and "'s" split off, punctuation,
    number words to digits, articles dropped, contractions restored."""
    text = answer.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()
    text = _punctuation(text.replace("\n", " ").replace("\t", " ").strip())
    words = [NUMBERS.get(word, word) for word in text.lower().split()]
    return " ".join(CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES)


def vqa_soft_accuracy(prediction: str, answers: list[str]) -> float:
    """For each annotator, min(1, matches among the other annotators / 3); their mean (lmms-eval's
    vizwiz_vqa and vqav2 `exact_match`). Both sides normalised."""
    if not answers:
        return 0.0
    predicted = normalize_answer(prediction)
    gold = [normalize_answer(answer) for answer in answers]
    return statistics.mean(min(1.0, sum(other == predicted for j, other in enumerate(gold) if j != i) / 3)
                           for i in range(len(gold)))


def scienceqa_exact_match(prediction: str, target: str) -> float:
    """lmms-eval's scienceqa scoring: the stripped reply equals the letter (any case), or is
    shaped "X. ..." with X, an upper-case letter, the target."""
    pred, target = prediction.strip(), target.strip().lower()
    if pred.lower() == target:
        return 1.0
    if len(pred) >= 2 and pred[0].isupper() and pred[1] == ".":
        return float(pred[0].lower() == target)
    return 0.0


LLAVA_OPTIONS = ("A", "B", "C", "D", "E")
_THE_ANSWER_IS = re.compile(r"The answer is ([A-Z]).")


def llava_scienceqa_answer(prediction: str, n_choices: int) -> str:
    """LLaVA's eval_science_qa.py reading of a reply: a bare option letter, "X. ...", or exactly one
    "The answer is X."; anything else (or a letter beyond the choices) is "FAILED", scored wrong."""
    if prediction in LLAVA_OPTIONS:
        answer = prediction
    elif len(prediction) >= 3 and prediction[0] in LLAVA_OPTIONS and prediction[1:3] == ". ":
        answer = prediction[0]
    else:
        found = _THE_ANSWER_IS.findall(prediction)
        answer = found[0] if len(found) == 1 else "FAILED"
    return answer if answer in LLAVA_OPTIONS[:n_choices] else "FAILED"


VIZWIZ_POST_PROMPT = ("\nWhen the provided information is insufficient, respond with 'Unanswerable'."
                      "\nAnswer the question using a single word or phrase.")


def vizwiz_prompt(doc: dict) -> str:
    """lmms-eval's vizwiz_vqa prompt: the question capitalised (str.capitalize, which also lowers the
    rest), then the post-prompt. LLaVA's llava_test.jsonl holds the question with that post-prompt
    appended (`text`); the hub's schema holds it alone (`question`)."""
    question = doc["question"] if "question" in doc else doc["text"].removesuffix(VIZWIZ_POST_PROMPT)
    return question.capitalize() + VIZWIZ_POST_PROMPT


def annotator_answers(doc: dict) -> list[str]:
    """The annotators' answers: strings (the hub's schema) or VizWiz's {"answer", "answer_confidence"}."""
    return [a["answer"] if isinstance(a, dict) else a for a in doc.get("answers") or []]


@dataclass
class VQATask(GenerateUntilTask):
    """A generation task scored by VQA soft accuracy (`exact_match`, lmms-eval's name) against the
    document's annotator answers; the record's `exact_match_answer` is the normalised reply.

    A split without answers (VizWiz test) is a submission: no metric is logged, and the normalised
    replies are written as the evaluation server's JSON ([{"image", "answer"}], the file LLaVA's
    convert_vizwiz_for_submission.py writes), artifact submission/<task>.json."""

    _submission: bool | None = field(default=None, init=False, repr=False)

    @property
    def submission(self) -> bool:
        if self._submission is None:
            docs = self.docs()
            answered = sum(bool(annotator_answers(doc)) for doc in docs)
            if 0 < answered < len(docs):
                first = next(i for i, doc in enumerate(docs) if not annotator_answers(doc))
                raise ValueError(f"task {self.name}: {answered} of {len(docs)} questions have answers and document "
                                 f"{first} has none; a split is either scored (every question answered) or a submission")
            self._submission = answered == 0
        return self._submission

    @property
    def metrics(self) -> list[str]:
        return [] if self.submission else list(self.filters)

    def check(self) -> None:
        super().check()
        _ = self.submission  # a half-answered file fails here, before any model loads

    def score(self, response: str, request: Request) -> tuple[dict[str, str], dict[str, float]]:
        answers = {name: normalize_answer(response) for name in self.filters}
        if self.submission:
            return answers, {}
        return answers, {name: vqa_soft_accuracy(response, annotator_answers(request.doc)) for name in self.filters}

    def artifacts(self, records: list[dict]) -> dict[str, list]:
        if not self.submission:
            return {}
        return {f"submission/{self.name}.json": [{"image": r["image"], "answer": r[f"{self.primary}_answer"]}
                                                 for r in records]}

    def process_results(self, request: Request, responses: list[str]) -> dict:
        return {**super().process_results(request, responses), "image": request.doc.get("image")}
