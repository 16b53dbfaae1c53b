"""`hyfunc serve` end to end: a real uvicorn process around a tiny random cascade, driven by the
official `openai` SDK. The answers' content is random; their shape, the tool_choice rules and the
stream/non-stream equality are what is checked."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.serve_process import running_server

KEY = "test-key"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "description": "Check that the service is up"}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a restaurant table",
        "parameters": {"type": "object", "properties": {"people": {"type": "integer"}, "time": {"type": "string"}},
                       "required": ["people"]}}},
]
PARAMS = {t["function"]["name"]: set(t["function"].get("parameters", {}).get("properties", {})) for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server({"method": "cascade", "api_key": KEY, "max_body_bytes": 65536}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def _check_calls(message: Any, offered: set[str]) -> list[tuple[str, dict]]:
    """Every call well formed, to an offered tool, with offered arguments only."""
    out = []
    for call in message.tool_calls or []:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in offered
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments, dict) and set(arguments) <= PARAMS[call.function.name]
        out.append((call.function.name, arguments))
    return out


def _streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[Any, list[Any]]:
    """The completion assembled by the SDK's own stream accumulator, and the raw chunks."""
    state = ChatCompletionStreamState()
    chunks = []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        chunks.append(chunk)
        state.handle_chunk(chunk)
    # The snapshot, not get_final_completion(): that one refuses answers cut by max_tokens.
    return state.current_completion_snapshot, chunks


def _same(a: Any, b: Any) -> None:
    ma, mb = a.choices[0].message, b.choices[0].message
    assert ma.content == mb.content
    assert [(c.function.name, c.function.arguments) for c in ma.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in mb.tool_calls or []]
    assert a.choices[0].finish_reason == b.choices[0].finish_reason
    assert a.usage.model_dump() == b.usage.model_dump()


def test_auto_answers_with_calls_to_offered_tools(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=ASK, tools=TOOLS)
    assert raw.headers["x-hyfunc-path"] == "cascade"
    assert "large_prefill;dur=" in raw.headers["server-timing"]
    done = raw.parse()
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-") and done.model == "hyfunc"
    assert done.choices[0].finish_reason == "tool_calls"
    assert _check_calls(done.choices[0].message, set(PARAMS))
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens > 0


def test_required_and_named_tool_choice(client: openai.OpenAI) -> None:
    required = client.chat.completions.create(model="hyfunc", messages=ASK, tools=TOOLS, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls" and _check_calls(required.choices[0].message, set(PARAMS))
    for name in ("ping", "book_table"):
        named = client.chat.completions.create(
            model="hyfunc", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}})
        calls = _check_calls(named.choices[0].message, {name})
        assert calls and named.choices[0].finish_reason == "stop"  # OpenAI's finish_reason for a named choice
        if name == "ping":
            assert calls[0][1] == {}


def test_text_replies_without_tools_or_with_tool_choice_none(client: openai.OpenAI) -> None:
    for kwargs in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        done = client.chat.completions.create(model="hyfunc", messages=ASK, max_tokens=5, temperature=0.7, **kwargs)
        message = done.choices[0].message
        assert message.tool_calls is None and message.content and message.content.strip()
        assert done.choices[0].finish_reason in ("stop", "length")
        assert done.usage.completion_tokens <= 5


def test_parallel_tool_calls_false_gives_at_most_one_call(client: openai.OpenAI) -> None:
    for choice in ("auto", "required"):
        done = client.chat.completions.create(
            model="hyfunc", messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
        assert len(done.choices[0].message.tool_calls or []) <= 1


@pytest.mark.parametrize("kwargs", [
    {"tools": TOOLS},
    {"tools": TOOLS, "tool_choice": "required"},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "ping"}}},
    {"tools": TOOLS, "tool_choice": "none", "max_tokens": 6},
    {"max_tokens": 6},
], ids=["auto", "required", "named-empty-args", "none", "no-tools"])
def test_stream_equals_the_non_streamed_answer(client: openai.OpenAI, kwargs: dict) -> None:
    plain = client.chat.completions.create(model="hyfunc", messages=ASK, **kwargs)
    streamed, chunks = _streamed(client, model="hyfunc", messages=ASK, **kwargs)
    _same(plain, streamed)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage chunk comes last
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            # a call's first delta carries id, type, name and empty arguments; fragments only the index
            assert (call.id is None) == (call.function.name is None)
            if call.id:
                assert call.type == "function" and call.function.arguments == ""


def test_stream_is_server_sent_events_ending_with_done(server: str) -> None:
    body = {"model": "hyfunc", "messages": ASK, "tools": TOOLS, "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-hyfunc-path"] == "cascade"
        lines = [line for line in r.iter_lines() if line]
    # data lines, and one comment line (ignored by clients) with the stage timings before [DONE]
    assert all(line.startswith("data: ") for line in lines[:-2]) and lines[-1] == "data: [DONE]"
    assert lines[-2].startswith(": server-timing ") and "small_decode;dur=" in lines[-2]


def test_a_conversation_with_a_tool_result(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You are a weather assistant."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "unit": "celsius"}'},
        {"role": "assistant", "content": "It is 18 degrees in Paris."},
        {"role": "user", "content": [{"type": "text", "text": "And in Berlin?"}]},
    ]
    done = client.chat.completions.create(model="hyfunc", messages=messages, tools=TOOLS)
    assert done.choices[0].message.tool_calls or done.choices[0].message.content
    _check_calls(done.choices[0].message, set(PARAMS))
    after_result = client.chat.completions.create(model="hyfunc", messages=messages[:4], tools=TOOLS, max_tokens=5)
    assert after_result.choices[0].message.tool_calls or after_result.choices[0].message.content


def test_models_health_and_metrics(client: openai.OpenAI, server: str) -> None:
    assert [m.id for m in client.models.list().data][0] == "hyfunc"
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    text = httpx.get(f"{server}/metrics").text
    for name in ("hyfunc:e2e_request_latency_seconds_bucket", 'hyfunc:stage_latency_seconds_count{stage="large_prefill"}',
                 'hyfunc:requests_total{status="200"}', "hyfunc:num_requests_waiting", "hyfunc:library_cache_hits_total",
                 "hyfunc:injected_tokens_total", "hyfunc:time_to_first_token_seconds_count"):
        assert name in text, name
    # Every request above carried the same tools: one build of the library state, then reuse.
    hits = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("hyfunc:library_cache_hits_total")))
    assert hits >= 1
