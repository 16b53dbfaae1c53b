"""The step after a tool result: conversations in chat form, the agent data built from fc-train,
the next-step head, and the cascade and server deciding with it (tiny random models)."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from hyfunc.cascade.agent_steps import ANSWER, CALL, agent_steps, follow_ups, tool_result
from hyfunc.cascade.data import load_examples
from hyfunc.cascade.next_step import NextStepConfig, NextStepHead, best_threshold, fit_head, held_out_scores
from hyfunc.cascade.retriever import Retriever
from hyfunc.data import FC_TRAIN
from hyfunc.formats.messages import conversation_text, follow_up_alone, plain_chat
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import CascadeOptions
from hyfunc.serving import ServeConfig, create_app
from tests.serve_app import LARGE_HIDDEN, tiny_cascade
from tests.test_serve_sdk import TOOLS

CALLED = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
LOOP = [
    {"role": "user", "content": "Weather in Oslo?"},
    CALLED,
    {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 12, "sky": "rain"}'},
]


def test_conversation_text_and_plain_chat_read_calls_and_results() -> None:
    text = conversation_text(LOOP)
    assert text == ('Request: Weather in Oslo?\n\nDone so far for this request:\n'
                    'Assistant called get_weather({"city": "Oslo"})\n'
                    'Result of get_weather: {"temperature": 12, "sky": "rain"}')
    assert conversation_text(LOOP[:1]) == "Weather in Oslo?"
    plain = plain_chat([{"role": "system", "content": "S"}, *LOOP])
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[2]["content"] == 'Assistant called get_weather({"city": "Oslo"})'


def test_chat_prompts_use_the_templates_tool_turns_or_fall_back_to_plain_ones() -> None:
    from tests.tiny_models import tiny_backend

    backend = tiny_backend()
    # The tiny template renders only `content`: the call would vanish, so plain turns are used.
    assert 'Assistant called get_weather({"city": "Oslo"})' in backend.chat_prompt(LOOP)
    backend.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}")
    assert "Result of get_weather: " in backend.chat_prompt(LOOP)
    backend.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }} "
        "{{ c.function.arguments | tojson }}</call>{% endfor %}{% else %}{{ m.role }}: {{ m.content }}{% endif %}\n"
        "{% endfor %}")
    native = backend.chat_prompt(LOOP)
    # the template's own form, with the wire's JSON-string arguments rendered once, not quoted twice
    assert '<call>get_weather {"city": "Oslo"}</call>' in native and "Assistant called" not in native


@pytest.fixture(scope="module")
def steps() -> list:
    return agent_steps(load_examples(FC_TRAIN), per_source=20, seed=0)


def test_agent_steps_end_with_results_of_calls_made_and_say_what_is_left(steps: list) -> None:
    assert {s.label for s in steps} == {ANSWER, CALL}
    assert len({s.source for s in steps}) == 7
    for step in steps:
        made = {c["id"]: c["function"] for m in step.messages for c in m.get("tool_calls") or []}
        results = [m["tool_call_id"] for m in step.messages if m["role"] == "tool"]
        assert step.messages[0]["role"] == "user" and step.messages[-1]["role"] == "tool"
        assert sorted(results) == sorted(made), step.id  # every call answered, once
        names = {t.name for t in step.tools}
        assert all(f["name"] in names for f in made.values())
        assert bool(step.remaining) == (step.label == CALL)
        assert all(c["name"] in names for c in step.remaining)
    again = agent_steps(load_examples(FC_TRAIN), per_source=20, seed=0)
    assert [s.messages for s in again] == [s.messages for s in steps]  # seeded


def test_follow_ups_are_a_finished_request_then_another_request_or_none_for_the_offered_tools() -> None:
    small_talk = ["Thanks, that is all.", "Tell me a joke."]
    made = follow_ups(load_examples(FC_TRAIN), per_source=2, small_talk=small_talk, seed=0)
    kinds = {s.form for s in made}
    assert kinds == {"follow_up", "follow_up_unrelated", "follow_up_small_talk"}
    assert len(made) == 3 * 2 * 7  # three kinds, two pairs per source, seven sources
    for step in made:
        history, last = step.messages[:-1], step.messages[-1]
        assert history[0]["role"] == "user" and history[-1]["role"] == "assistant" and history[-1]["content"]
        assert any(m["role"] == "tool" for m in history) and last["role"] == "user"
        assert follow_up_alone(step.messages) == [last]
        first = {c["function"]["name"] for m in history for c in m.get("tool_calls") or []}
        names = {t.name for t in step.tools}
        assert first <= names
        if step.form == "follow_up":  # the next request's tools are offered beside the first one's
            assert step.label == CALL and step.remaining and {c["name"] for c in step.remaining} <= names
        else:
            assert step.label == ANSWER and not step.remaining
        if step.form == "follow_up_small_talk":
            assert last["content"] in small_talk
    again = follow_ups(load_examples(FC_TRAIN), per_source=2, small_talk=small_talk, seed=0)
    assert [s.messages for s in again] == [s.messages for s in made]  # seeded


def test_whether_a_tool_fits_a_follow_up_is_read_from_the_new_message_alone() -> None:
    system = {"role": "system", "content": "Be brief."}
    done = [*LOOP, {"role": "assistant", "content": "12 degrees and rain in Oslo."}]
    assert follow_up_alone(LOOP) is None and follow_up_alone(LOOP[:1]) is None and follow_up_alone(done) is None
    follow_up = [system, *done, {"role": "user", "content": "And in Bergen?"}]
    assert follow_up_alone(follow_up) == [system, follow_up[-1]]
    cascade, tools = tiny_cascade(), parse_tools(TOOLS)
    torch.manual_seed(0)
    cascade.retriever = Retriever(replace(cascade.retriever.config, refusal_head=True)).eval()
    conversation_only = cascade.variant(CascadeOptions(follow_up_alone=False), "the conversation decides")

    def flip_head() -> tuple[float, float]:  # the head's answerabilities of (conversation, new message) negated
        with torch.no_grad():
            cascade.retriever.refusal.weight.neg_()
            cascade.retriever.refusal.bias.neg_()
            passes = [cascade.encoder.encode(m, tools) for m in (follow_up, follow_up_alone(follow_up))]
            scores = [cascade.retriever.scores(p.soft_token, p.function_embeddings) for p in passes]
            conversation, alone = (float(cascade.retriever.answerability(p.soft_token, [s])) for p, s in zip(passes, scores))
        return conversation, alone

    conversation, alone = flip_head()
    if conversation > alone:
        conversation, alone = flip_head()
    # A tool fits the new message, not the conversation: called
    cascade.retriever.config.refusal_threshold = (conversation + alone) / 2
    called = cascade.answer(follow_up, tools)
    assert called.calls and "follow_up_prefill" in called.timings
    assert called.details["answerability"] == pytest.approx(alone, abs=1e-3)
    assert called.details["answerability_conversation"] == pytest.approx(conversation, abs=1e-3)
    assert conversation_only.answer(follow_up, tools).calls == []
    # and the other way round: refused, where the conversation alone would have called
    conversation, alone = flip_head()
    assert conversation > alone
    cascade.retriever.config.refusal_threshold = (conversation + alone) / 2
    assert cascade.answer(follow_up, tools).calls == []
    assert conversation_only.answer(follow_up, tools).calls
    # a first request reads itself once
    assert "follow_up_prefill" not in cascade.answer(LOOP[:1], tools).timings


def test_tool_results_are_json_or_prose_about_the_call() -> None:
    import random

    rng = random.Random(0)
    made = [tool_result({"name": "getWeather", "arguments": {"city": "Oslo"}}, rng) for _ in range(30)]
    results = [text for text, _ in made]
    as_json = [r for r in results if r.startswith("{")]
    assert as_json and len(as_json) < len(results)
    assert all(isinstance(json.loads(r), dict) for r in as_json)
    assert any(r.startswith("Get weather for city Oslo") for r in results)
    # the key facts are the outcome's values, and every result states them
    for text, facts in made:
        assert facts and all(fact in text for fact in facts), (text, facts)


def _separable(n: int, hidden: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    answers = torch.arange(n) % 2 == 0
    x = torch.randn(n, hidden, generator=g)
    x[:, 0] += torch.where(answers, 3.0, -3.0)
    return x, answers


def test_the_head_learns_the_decision_and_survives_a_round_trip(tmp_path: Any) -> None:
    x, answers = _separable(200)
    head = fit_head(x, answers, NextStepConfig(threshold=0.5))
    assert float(((head.p_answer(x) >= 0.5) == answers).float().mean()) > 0.95
    head.save(tmp_path / "next_step")
    loaded = NextStepHead.load(tmp_path / "next_step")
    assert torch.equal(loaded.p_answer(x), head.p_answer(x)) and loaded.config == head.config
    with pytest.raises(ValueError, match="both kinds"):
        fit_head(x[answers], answers[answers], NextStepConfig())


def test_held_out_scores_come_from_heads_that_never_saw_the_source() -> None:
    x, answers = _separable(120)
    sources = ["a"] * 40 + ["b"] * 40 + ["c"] * 40
    scores = held_out_scores(x, answers, sources, NextStepConfig())
    assert scores.shape == (120,) and float(((scores >= 0.5) == answers).float().mean()) > 0.9
    threshold = best_threshold(scores, answers, sources)
    assert 0 < threshold < 1


def _head(bias: float) -> NextStepHead:
    zero = torch.zeros(LARGE_HIDDEN)
    return NextStepHead(zero, torch.tensor([bias]), zero, torch.ones(LARGE_HIDDEN), NextStepConfig(threshold=0.5))


def test_the_cascade_answers_after_tool_results_when_its_head_says_done() -> None:
    cascade = tiny_cascade()
    tools = parse_tools(TOOLS)
    cascade.next_step = _head(+20.0)
    done = cascade.answer(LOOP, tools)
    assert done.calls == [] and done.details["next_step"] == "answer" and done.details["p_answer"] == 1.0
    # the first request is the retriever's decision, not the head's
    first = cascade.answer(LOOP[:1], tools)
    assert "next_step" not in first.details and first.calls
    cascade.next_step = _head(-20.0)  # not done: the cascade goes on to a call, the retriever refusing none
    cascade.retriever.config.refusal_threshold = 2.0
    not_done = cascade.answer(LOOP, tools)
    assert not_done.details["next_step"] == "call" and not_done.calls
    assert cascade.answer(LOOP[:1], tools).calls == []  # a first request: the retriever's refusal stands


def test_the_server_writes_the_answer_from_the_results_when_the_head_says_done() -> None:
    cascade = tiny_cascade()
    cascade.next_step = _head(+20.0)
    app = create_app(lambda: cascade, ServeConfig(context_tokens=4096, default_max_tokens=4))
    with TestClient(app) as client:
        body = client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": LOOP, "tools": TOOLS}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and "tool_calls" not in choice["message"]
    assert isinstance(choice["message"]["content"], str)


def test_a_conversation_trimmed_to_fit_says_so_in_its_usage() -> None:
    CONTEXT = 1000  # tiny-tokenizer tokens: the tools take 370, the whole conversation about 1,900
    history = []
    for i in range(30):  # earlier exchanges that cannot all fit a small context
        history += [{"role": "user", "content": f"What is the weather like in Paris today? {i}"},
                    {"role": "assistant", "content": f"It is {i} degrees in Paris today."}]
    messages = [*history, *LOOP]
    cascade = tiny_cascade()
    app = create_app(lambda: cascade, ServeConfig(context_tokens=CONTEXT, default_max_tokens=4))
    with TestClient(app) as client:
        trimmed = client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": messages, "tools": TOOLS}).json()
        whole = client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": LOOP, "tools": TOOLS}).json()
    assert trimmed["usage"]["trimmed_messages"] > 0 and trimmed["usage"]["trimmed_messages"] % 2 == 0
    assert "trimmed_messages" not in whole["usage"]
