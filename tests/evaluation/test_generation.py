"""The generate_until engine on a tiny random model: batched left-padded generation equals one prompt
at a time, stop strings cut the text (never across the prompt's end), prompts and group scores."""

from __future__ import annotations

import math

import pytest
import torch

from prunebench.api.metrics import mean_stderr
from prunebench.evaluation.generation.greedy import Generator, cut_at_stops
from prunebench.models.tiny import load_tiny
from prunebench.tasks.generate_until import ExactMatch, GenerateUntilTask, Regex, TaskGroup

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny(name="tiny", config=CONFIG)


class ListSource:
    def __init__(self, docs):
        self.docs = docs

    def check(self):
        pass

    def load(self):
        return self.docs


def plain_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """The reference: one unpadded sequence, the full forward at every step, argmax."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_left_padded_batch_generates_what_each_prompt_generates_alone(tiny):
    tok = tiny.tokenizer
    prompts = [tok.encode(t) for t in ["The quick brown fox", "Question: What is the capital", "A man"]]
    gen = Generator(tiny, until=[], max_new_tokens=12)
    texts = gen(prompts)
    for prompt, text in zip(prompts, texts):
        expected = plain_greedy(tiny.model, prompt, 12)
        eos = tok.eos_token_id
        expected = expected[:expected.index(eos)] if eos in expected else expected
        assert text == tok.decode(expected, skip_special_tokens=True)


def test_generation_stops_at_a_stop_string_and_the_text_is_cut_before_it(tiny):
    tok = tiny.tokenizer
    prompt = tok.encode("The quick brown fox")
    free = Generator(tiny, until=[], max_new_tokens=20)([prompt])[0]
    assert len(free) > 6
    stop = free[3:5]
    stopped = Generator(tiny, until=[stop], max_new_tokens=20)
    assert stopped([prompt]) == [free.split(stop)[0]]


def test_a_stop_string_spanning_the_prompt_end_does_not_stop_generation(tiny):
    tok = tiny.tokenizer
    prompt = tok.encode("The quick brown fox")
    free = Generator(tiny, until=[], max_new_tokens=10)([prompt])[0]
    # the prompt's last character plus the generation's first: only in prompt + generation
    stop = "x" + free[0]
    assert stop not in free
    assert Generator(tiny, until=[stop], max_new_tokens=10)([prompt]) == [free]


def test_cut_at_stops_applies_every_stop_string_in_turn():
    assert cut_at_stops(" True\n\nQ: next", ["Q:", "\n\n"]) == " True"
    assert cut_at_stops("abc", ["", "z"]) == "abc"


def test_prompt_renders_description_exemplars_and_document():
    task = GenerateUntilTask("t", ListSource([{"input": "2+2", "target": "4"}]), "Q: {{input}}\nA:",
                             description="Add.\n\n", fewshot=[{"input": "1+1", "target": "2"}])
    request = task.instances()[0]
    assert request.prompt == "Add.\n\nQ: 1+1\nA: 2\n\nQ: 2+2\nA:"
    assert request.target == "4"


def test_regex_filter_and_exact_match_follow_lm_eval():
    assert Regex(r"\b(True|False)\b")(" it is False, not True", {}) == "False"
    assert Regex(r"(a)|(b)")("b", {}) == "b"
    assert Regex(r"\d+")("none", {}) == "[invalid]"
    match = ExactMatch(ignore_case=True, regexes_to_ignore=[r"\.$", ",", "\n"])
    assert match("Yes.", "yes") == 1.0
    assert match(" yes", "yes") == 0.0
    assert ExactMatch()("Yes", "yes") == 0.0


def test_group_score_is_size_weighted_for_lm_eval_and_plain_for_opencompass():
    task = GenerateUntilTask("a", ListSource([]), "{{input}}")
    weighted, plain = TaskGroup("g", [task]), TaskGroup("g", [task], weight_by_size=False)
    means, sizes = [1.0, 0.0], [3, 1]
    values = [[1.0] * 3, [0.0]]
    stderrs = [mean_stderr(v) if len(v) > 1 else 0.0 for v in values]
    assert weighted.aggregate(means, stderrs, sizes)[0] == pytest.approx(0.75)
    assert plain.aggregate(means, stderrs, sizes)[0] == pytest.approx(0.5)
    # pooled stderr (lm-eval): equal sizes and equal stderrs give se / sqrt(k) * sqrt((n-1)k/(nk-k))
    score, se = weighted.aggregate([0.5, 0.5], [0.2, 0.2], [10, 10])
    assert se == pytest.approx(math.sqrt(9 * 0.04 * 10 * 2 / 18 / 20))


def test_group_members_must_share_generation_settings():
    a = GenerateUntilTask("a", ListSource([]), "{{input}}", until=["\n"])
    b = GenerateUntilTask("b", ListSource([]), "{{input}}", until=["Q"])
    with pytest.raises(ValueError, match="stop strings"):
        TaskGroup("g", [a, b])
