"""Judges against a real chat-completions server on 127.0.0.1: replies parsed by each benchmark's rule,
429 / 5xx retried with backoff by the client, every reply cached on disk as JSON, the key never shown."""

from __future__ import annotations

import json

import pytest

from helpers.chat_server import ChatServer, user_text
from prunebench.judges.openai_compatible import OpenAICompatibleJudge
from prunebench.tasks.llava_bench import parse_score
from prunebench.tasks.mm_vet import parse_correctness

MESSAGES = [{"role": "user", "content": "Rate: A vs B"}]


@pytest.fixture(autouse=True)
def judge_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "judge"


def scripted(*replies):
    """A server answering the given (status, text) replies in order, then the last one forever."""
    queue = list(replies)
    return ChatServer(lambda body, auth: queue.pop(0) if len(queue) > 1 else queue[0])


def test_llava_bench_scores_read_as_llava_reads_them():
    # eval_gpt_review_visual.parse_score: the first line, commas as spaces, exactly two numbers
    assert parse_score("8 6\nAssistant 1 is better.") == [8.0, 6.0]
    assert parse_score("7,9") == [7.0, 9.0]
    assert parse_score("7.5 10") == [7.5, 10.0]
    assert parse_score("Assistant 1: 8, Assistant 2: 6") is None  # more than two words
    assert parse_score("8, 6") is None  # "8  6" splits into three: LLaVA gives [-1, -1] too
    assert parse_score("eight six") is None


def test_mm_vet_correctness_read_as_its_grader_reads_it():
    assert parse_correctness("0.7") == 0.7
    assert parse_correctness("1.0 because") == 1.0
    assert parse_correctness("1.5") is None  # outside [0, 1]
    assert parse_correctness("Correctness: 0.5") is None


def test_a_reply_is_cached_as_json_and_a_rerun_asks_nothing(judge_cache):
    with scripted((200, "8 6\nfine")) as server:
        judge = OpenAICompatibleJudge(model="judge-model", url=server.url, api_key_env=None)
        first = judge.reply(MESSAGES, temperature=0.2, max_tokens=16)
        again = OpenAICompatibleJudge(model="judge-model", url=server.url, api_key_env=None).reply(
            MESSAGES, temperature=0.2, max_tokens=16)
        other_model = OpenAICompatibleJudge(model="another", url=server.url, api_key_env=None).reply(
            MESSAGES, temperature=0.2, max_tokens=16)
    assert (first.text, first.cached) == ("8 6\nfine", False)
    assert (again.text, again.cached) == ("8 6\nfine", True)
    assert not other_model.cached  # the judge model is part of the key
    assert len(server.requests) == 2
    body = server.requests[0]
    assert (body["model"], body["temperature"], body["max_tokens"], user_text(body)) == ("judge-model", 0.2, 16, "Rate: A vs B")
    stored = [json.loads(p.read_text()) for p in sorted(judge_cache.glob("*.json"))]
    assert sorted(s["judge"] for s in stored) == ["another", "judge-model"]
    assert all(s["reply"] == "8 6\nfine" and s["messages"] == MESSAGES for s in stored)


def test_each_repeat_has_its_own_cache_entry_and_repeat_0_the_key_of_before(judge_cache):
    """judge.repeats grades an answer again: a repeat must reach the server, not read the first
    grading back; a rerun reads each repeat's own reply."""
    with scripted((200, "8 6"), (200, "7 5"), (200, "9 9")) as server:
        judge = OpenAICompatibleJudge(model="judge-model", url=server.url, api_key_env=None, repeats=2)
        first, second = (judge.reply(MESSAGES, 0.2, 16, repeat=r) for r in (0, 1))
        again = [judge.reply(MESSAGES, 0.2, 16, repeat=r) for r in (0, 1)]
    assert (first.text, first.cached, second.text, second.cached) == ("8 6", False, "7 5", False)
    assert [(r.text, r.cached) for r in again] == [("8 6", True), ("7 5", True)]
    assert len(server.requests) == 2
    stored = {json.loads(p.read_text()).get("repeat", 0): p.name for p in judge_cache.glob("*.json")}
    # repeat 0's entry is keyed as every reply was before repeats existed: old caches still answer
    from prunebench.cache import content_key

    before = {"judge": "judge-model", "messages": MESSAGES, "temperature": 0.2, "max_tokens": 16}
    assert stored[0] == f"{content_key(before)}.json" and stored[1] != stored[0]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_rate_limits_and_server_errors_are_retried(status):
    with scripted((status, "busy"), (200, "0.4")) as server:
        reply = OpenAICompatibleJudge(model="m", url=server.url, api_key_env=None, max_retries=3).reply(MESSAGES)
    assert reply.text == "0.4" and len(server.requests) == 2


def test_a_server_failing_past_the_retries_raises_and_caches_nothing(judge_cache):
    import openai

    with scripted((500, "down")) as server:
        with pytest.raises(openai.InternalServerError):
            OpenAICompatibleJudge(model="m", url=server.url, api_key_env=None, max_retries=2).reply(MESSAGES)
    assert len(server.requests) == 3  # the first try and two retries
    assert not list(judge_cache.glob("*.json"))


def test_the_key_comes_from_the_environment_and_is_never_shown(monkeypatch):
    monkeypatch.setenv("PB_JUDGE_KEY", "sk-secret-123")
    seen = []
    with ChatServer(lambda body, auth: (seen.append(auth), (200, "1 2"))[1]) as server:
        judge = OpenAICompatibleJudge(model="m", url=server.url, api_key_env="PB_JUDGE_KEY")
        judge.check()
        judge.reply(MESSAGES)
    assert seen == ["Bearer sk-secret-123"]
    assert "sk-secret" not in repr(judge) and "sk-secret" not in str(vars(judge).get("api_key_env"))
    monkeypatch.delenv("PB_JUDGE_KEY")
    with pytest.raises(ValueError, match="PB_JUDGE_KEY.*not set.*api_key_env=null"):
        OpenAICompatibleJudge(model="m", url=server.url, api_key_env="PB_JUDGE_KEY").check()


@pytest.mark.parametrize("models_status", [200, 404, 403])
def test_a_judge_that_answers_is_reached_with_one_request_and_no_chat(models_status):
    with ChatServer(lambda body, auth: (200, "1 2"), models_status) as server:
        OpenAICompatibleJudge(model="m", url=server.url, api_key_env=None).reach()
    assert server.requests == []  # no chat completion asked (nothing to pay for)


def test_a_judge_server_down_or_refusing_the_key_is_named_without_the_key(monkeypatch):
    import socket

    with socket.socket() as free:  # a port nothing listens on once closed
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
    monkeypatch.setenv("PB_JUDGE_KEY", "sk-secret-123")
    with pytest.raises(ValueError, match=rf"judge.url='{url}': no connection") as err:
        OpenAICompatibleJudge(model="m", url=url, api_key_env="PB_JUDGE_KEY").reach()
    assert "sk-secret" not in str(err.value)
    with ChatServer(lambda body, auth: (200, "1 2"), models_status=401) as server:
        with pytest.raises(ValueError, match=r"refused the key from \$PB_JUDGE_KEY \(HTTP 401\)") as err:
            OpenAICompatibleJudge(model="m", url=server.url, api_key_env="PB_JUDGE_KEY").reach()
    assert "sk-secret" not in str(err.value)


def test_a_local_causal_lm_judges_greedily_through_its_chat_template(tmp_path):
    import torch
    from omegaconf import OmegaConf

    from conftest import CONF_DIR
    from prunebench.judges.hf_causal import HFCausalJudge
    from prunebench.models.tiny import load_tiny

    options = OmegaConf.to_container(OmegaConf.load(f"{CONF_DIR}/model/tiny-llama.yaml"))
    options.pop("_target_")
    loaded = load_tiny(**options)
    loaded.tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    loaded.model.save_pretrained(tmp_path / "judge")
    loaded.tokenizer.save_pretrained(tmp_path / "judge")
    judge = HFCausalJudge(path=str(tmp_path / "judge"))
    reply = judge.reply(MESSAGES, max_tokens=6)
    # the same greedy continuation of the rendered chat, computed here with the in-memory model
    ids = loaded.tokenizer("<|user|>Rate: A vs B\n<|assistant|>", return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                    pad_token_id=loaded.tokenizer.pad_token_id)
    assert reply.text == loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert not reply.cached and judge.reply(MESSAGES, max_tokens=6).cached
