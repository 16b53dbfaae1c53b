"""Streamed tool calls: the JSON call list -> OpenAI deltas (`CallStream`), and a streamed answer
equal to the non-streamed one through the real app (tiny random cascade, in process)."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from hyfunc.formats.schema import parse_tools
from hyfunc.serving import ServeConfig, create_app
from hyfunc.serving.call_stream import CallStream, CallStreamError
from hyfunc.serving.conversation import call_key
from hyfunc.formats.calls import Call
from hyfunc.serving.streaming import ChunkWriter
from tests.serve_app import tiny_cascade
from tests.test_serve_sdk import ASK, TOOLS

SCHEMAS = parse_tools([t["function"] for t in TOOLS])
TEXTS = [
    "[]",
    '[{"name": "ping", "arguments": {}}]',
    # parallel calls, {} arguments, escapes, unicode, nested braces inside strings
    '[{"name": "get_weather", "arguments": {"city": "Par\\"is \\\\ {x}", "unit": "celsius"}}, '
    '{"name": "ping", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Zürich \\u00e9 😀"}}, '
    '{"name": "book_table", "arguments": {"people": -2.5e3, "time": "7 pm"}}]',
]


def _run(text: str, chunks: list[str], **kwargs: Any) -> tuple[CallStream, list[dict]]:
    deltas: list[dict] = []
    stream = CallStream(SCHEMAS, deltas.append, **kwargs)
    for piece in chunks:
        stream.feed(piece)
    stream.close()
    assert stream.text == text
    return stream, deltas


def _assembled(deltas: list[dict]) -> list[tuple[str, str, str]]:
    """What the openai SDK's own accumulator makes of the deltas."""
    writer = ChunkWriter("chatcmpl-1", 1, "hyfunc")
    state = ChatCompletionStreamState()
    for chunk in [writer.role(), *(writer.tool_call(d) for d in deltas)]:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    calls = state.current_completion_snapshot.choices[0].message.tool_calls or []
    return [(c.id, c.function.name, c.function.arguments) for c in calls]


@pytest.mark.parametrize("text", TEXTS, ids=["none", "empty-arguments", "parallel-escapes-unicode"])
def test_deltas_assemble_to_the_message_however_the_text_is_cut(text: str) -> None:
    whole, deltas = _run(text, [text])
    expected = json.loads(text)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [(d["name"], d["arguments"]) for d in expected]
    # Arguments pass through as written (escapes and number spellings kept).
    assert all(f'"arguments": {c.arguments}' in text for c in whole.calls)
    assert _assembled(deltas) == [(c.id, c.name, c.arguments) for c in whole.calls]
    rng = random.Random(0)
    for cuts in ([text[i] for i in range(len(text))], None):
        if cuts is None:
            points = sorted(rng.sample(range(1, len(text)), min(12, len(text) - 1)))
            cuts = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
        stream, deltas = _run(text, cuts)
        assert [(c.name, c.arguments) for c in stream.calls] == [(c.name, c.arguments) for c in whole.calls]
        assert _assembled(deltas) == [(c.id, c.name, c.arguments) for c in stream.calls]
        for delta in deltas:  # a head carries id, type, name and "" ; a fragment only the index and text
            assert set(delta) == ({"index", "id", "type", "function"} if "id" in delta else {"index", "function"})


def test_what_may_not_be_sent_is_dropped_before_it_is_sent() -> None:
    text = ('[{"name": "rm_rf", "arguments": {"path": "/"}}, {"name": "get_weather", "arguments": '
            '{"city": "Paris", "shell": "x"}}, {"name": "ping", "arguments": {}}, {"name": "get_weather", '
            '"arguments": {"city": "Rome"}}]')
    stream, deltas = _run(text, list(text))
    assert [(c.name, c.arguments) for c in stream.calls] == [
        ("get_weather", '{"city": "Paris"}'), ("ping", "{}"), ("get_weather", '{"city": "Rome"}')]
    assert "rm_rf" not in json.dumps(deltas) and "shell" not in json.dumps(deltas)
    assert any("rm_rf" in note for note in stream.notes) and any("shell" in note for note in stream.notes)
    # Under auto a call already answered is not repeated: a call naming that tool waits until it is
    # closed, then goes whole (Rome) or not at all (Paris); the others stream as they come.
    answered = {call_key(Call("get_weather", {"city": "Paris"}))}
    stream, deltas = _run(text, list(text), skip=answered)
    assert [(c.name, c.arguments) for c in stream.calls] == [("ping", "{}"), ("get_weather", '{"city": "Rome"}')]
    rome = [d for d in deltas if d["index"] == 1]
    assert [d["function"]["arguments"] for d in rome] == ["", '{"city": "Rome"}']
    assert len([d for d in deltas if d["index"] == 0]) == 3  # ping streams as fed: head, "{", "}"
    stream, deltas = _run(text, [text], max_calls=1)  # parallel_tool_calls: false
    assert [c.name for c in stream.calls] == ["get_weather"] and {d["index"] for d in deltas} == {0}


@pytest.mark.parametrize("text", ['[{"arguments": {}, "name": "ping"}]', '[{"name": "ping", "arguments": {}}', '{"name": "ping"}',
                                  '[{"name": "ping", "arguments": []}]'])
def test_text_that_is_no_call_list_is_refused(text: str) -> None:
    with pytest.raises(CallStreamError):
        _run(text, [text])


# -- through the app -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(tiny_cascade(), ServeConfig(context_tokens=4096, default_max_tokens=4)))


def _post(client: TestClient, **kwargs: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"model": "hyfunc", **kwargs})
    assert response.status_code == 200, response.text
    return response


def _stream(client: TestClient, **kwargs: Any) -> tuple[Any, list[dict], list[str]]:
    lines = _post(client, stream=True, stream_options={"include_usage": True}, **kwargs).text.split("\n\n")
    state = ChatCompletionStreamState()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.current_completion_snapshot, chunks, [line for line in lines if line.startswith(":")]


ANSWERED = [*ASK, {"role": "assistant", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]


@pytest.mark.parametrize("kwargs", [
    {"tools": TOOLS},
    {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "ping"}}},
    {"tools": TOOLS, "messages": ANSWERED},
], ids=["auto-parallel", "required-single", "named-empty-args", "after-a-tool-result"])
def test_streamed_calls_equal_the_non_streamed_answer(client: TestClient, kwargs: dict) -> None:
    kwargs = {"messages": ASK, **kwargs}
    plain = _post(client, **kwargs).json()
    streamed, chunks, comments = _stream(client, **kwargs)
    message = plain["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    assert calls == [(c.function.name, c.function.arguments) for c in streamed.choices[0].message.tool_calls or []]
    assert message["content"] == streamed.choices[0].message.content
    assert plain["choices"][0]["finish_reason"] == streamed.choices[0].finish_reason
    assert plain["usage"] == streamed.usage.model_dump(exclude_none=True)
    fragments = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or [] if "id" not in d]
    answered = {"get_weather"} if kwargs["messages"] is ANSWERED else set()
    for index, (name, _) in enumerate(calls):
        sent = len([d for d in fragments if d["index"] == index])
        # Arguments arrive in pieces as they are written; a call to an answered tool, whole at its end.
        assert sent == 1 if name in answered else sent >= 2, (name, sent)
    # Stage timings of a streamed answer: an SSE comment after the last chunk (clients skip it).
    assert len(comments) == 1 and comments[0].startswith(": server-timing ") and "dur=" in comments[0]


def test_a_streamed_text_reply_equals_the_plain_one_and_reuses_the_last_prompt(client: TestClient) -> None:
    def cached() -> float:
        text = client.get("/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("hyfunc:cached_prompt_tokens_total")))

    kwargs = {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 5}
    plain = _post(client, **kwargs).json()
    before = cached()
    streamed, _, _ = _stream(client, **kwargs)
    assert streamed.choices[0].message.content == plain["choices"][0]["message"]["content"]
    # The same prompt again: all of it but its last token comes from the text replies' prefix cache.
    assert cached() - before >= plain["usage"]["prompt_tokens"] - 1


def test_a_method_without_on_text_streams_its_calls_when_done() -> None:
    from tests.serve_app import Slow

    # Slow.answer(messages, tools) is the Method protocol without the streaming keyword.
    client = TestClient(create_app(Slow(tiny_cascade(), 0), ServeConfig(context_tokens=4096, default_max_tokens=4)))
    plain = _post(client, messages=ASK, tools=TOOLS).json()
    streamed, chunks, _ = _stream(client, messages=ASK, tools=TOOLS)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in plain["choices"][0]["message"]["tool_calls"]]
    assert calls and calls == [(c.function.name, c.function.arguments) for c in streamed.choices[0].message.tool_calls]
    fragments = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or [] if "id" not in d]
    assert len(fragments) == len(calls)  # each call's arguments in one piece, once the answer is known
