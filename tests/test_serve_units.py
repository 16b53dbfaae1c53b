"""The server's parts in process: conversations, the traffic-log slot, the router slot, loading,
the tool-library cache (tiny random models; no server process). Streaming: test_serve_stream.py."""
from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyfunc.serving import ServeConfig, create_app
from hyfunc.serving.conversation import read_conversation
from hyfunc.serving.protocol import ChatCompletionRequest
from hyfunc.serving.replies import with_results_reminder
from tests.odia_fixtures import ListSink
from tests.serve_app import tiny_cascade
from tests.test_serve_sdk import ASK, TOOLS

CONFIG = dict(context_tokens=4096, default_max_tokens=4)


def _conversation(messages: list[dict]) -> Any:
    return read_conversation(ChatCompletionRequest.model_validate({"model": "m", "messages": messages}).messages)


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    {"role": "assistant", "content": "18 C in Paris."},
    {"role": "user", "content": "And in Berlin?"},
]


def test_the_methods_read_the_whole_conversation_as_chat_messages() -> None:
    conv = _conversation(HISTORY)
    messages = conv.method_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    # arguments as a dict (templates render them with tojson), the result linked to its call
    assert messages[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "18 C"}
    text = conv.transcript()  # what the parts trained on one request text read
    order = ["User: Weather in Paris?", 'Assistant called get_weather({"city": "Paris"})', "Result of get_weather: 18 C",
             "Assistant: 18 C in Paris.", "Request: And in Berlin?"]
    assert [text.index(piece) for piece in order] == sorted(text.index(piece) for piece in order)
    # a single request passes through unchanged
    single = _conversation(HISTORY[:2])
    assert single.method_messages()[1] == {"role": "user", "content": "Weather in Paris?"}
    assert single.transcript() == "Weather in Paris?"
    chat = conv.chat_messages("hint")
    assert chat[0]["content"].endswith("hint") and chat[1:] == messages[1:]


def test_a_reply_after_tool_results_is_asked_for_again_after_them() -> None:
    pending = _conversation(HISTORY[:4]).chat_messages("hint")  # Paris's call answered, no text yet
    asked = with_results_reminder(pending)
    assert asked[:-1] == pending and asked[-1]["role"] == "user"
    assert "(get_weather)" in asked[-1]["content"] and asked[-1]["content"].count("Weather in Paris?") == 1
    # the earlier exchange's results are answered already: a new request gets no reminder
    assert with_results_reminder(_conversation(HISTORY).chat_messages("hint")) == _conversation(HISTORY).chat_messages("hint")


def test_calls_already_answered_are_known_and_old_turns_go_first() -> None:
    pending = _conversation(HISTORY[:4])  # the call got its result; no new user message yet
    assert pending.answered_calls() == {'{"arguments": {"city": "Paris"}, "name": "get_weather"}'}
    assert _conversation(HISTORY).answered_calls() == set()
    words = lambda text: len(text.split())  # noqa: E731 - a token counter for the test
    full = _conversation(HISTORY)
    bounded = full.bounded(words(full.transcript()) - 1, words)
    assert bounded.request == "And in Berlin?" and "Weather in Paris" not in bounded.transcript()
    # the earlier exchange goes whole: no tool result is kept without the call it answers
    assert bounded.dropped == 4 and [t.role for t in bounded.turns] == ["user"]




@pytest.fixture(scope="module")
def cascade() -> Any:
    return tiny_cascade()


def _ask(client: TestClient, **kwargs: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": ASK, **kwargs})


def test_each_answer_is_recorded_once_and_a_failing_log_fails_nothing(cascade: Any) -> None:
    sink = ListSink()
    client = TestClient(create_app(cascade, ServeConfig(**CONFIG), traffic=sink))
    calls = _ask(client, tools=TOOLS).json()["choices"][0]["message"]["tool_calls"]
    _ask(client, stream=True)
    assert len(sink.records) == 2
    first, second = sink.records
    assert first.path == "cascade" and first.tools[0]["function"]["name"] == "get_weather"
    assert [c["name"] for c in first.calls] == [c["function"]["name"] for c in calls] and first.timings["large_prefill"] > 0
    assert first.models["large"] == "tiny" and second.calls == [] and second.text
    broken = TestClient(create_app(cascade, ServeConfig(**CONFIG), traffic=ListSink(fail=True)))
    assert _ask(broken, tools=TOOLS).status_code == 200
    assert "hyfunc:traffic_sink_errors_total 1.0" in broken.get("/metrics").text


def test_the_router_chooses_the_path(cascade: Any) -> None:
    from hyfunc.methods.direct import DirectMethod

    direct = DirectMethod(cascade.small, max_new_tokens=4)
    app = create_app({"cascade": cascade, "small": direct}, ServeConfig(**CONFIG),
                     router=lambda prepared: "small" if len(prepared.tools) == 1 else "cascade")
    client = TestClient(app)
    assert _ask(client, tools=TOOLS).headers["x-hyfunc-path"] == "cascade"
    assert _ask(client, tools=TOOLS[:1]).headers["x-hyfunc-path"] == "small"


def test_health_is_503_while_loading(cascade: Any) -> None:
    release = threading.Event()

    def load() -> Any:
        release.wait(10)
        return cascade

    with TestClient(create_app(load, ServeConfig(**CONFIG))) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/health/ready").json() == {"status": "loading", "detail": None}
        assert client.get("/health/live").status_code == 200  # up, only not ready
        loading = _ask(client)
        assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_not_ready"
        release.set()
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/health/ready").json()["status"] == "ready"
        assert _ask(client).status_code == 200


def test_a_loader_that_raises_leaves_the_server_failed_not_loading() -> None:
    def load() -> Any:
        raise OSError(28, "No space left on device")  # e.g. converting a model on a full disk

    with TestClient(create_app(load, ServeConfig(**CONFIG))) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "No space left on device" in health.json()["detail"]
        assert client.get("/health/ready").json()["status"] == "failed"


def _metric(client: TestClient, name: str) -> float:
    return float(next(line.split()[-1] for line in client.get("/metrics").text.splitlines() if line.startswith(name)))


def test_same_tools_in_any_key_order_share_the_library_state(cascade: Any) -> None:
    client = TestClient(create_app(cascade, ServeConfig(**CONFIG, library_cache=1)))
    shuffled = copy.deepcopy(TOOLS)
    shuffled[0]["function"] = dict(reversed(list(shuffled[0]["function"].items())))
    first = _ask(client, tools=TOOLS)
    again = _ask(client, tools=shuffled)
    assert "library_build" in first.headers["server-timing"] and "library_build" not in again.headers["server-timing"]
    assert first.json()["choices"][0]["message"]["tool_calls"][0]["function"] == again.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (_metric(client, "hyfunc:library_cache_hits_total"), _metric(client, "hyfunc:library_cache_misses_total")) == (1, 1)
    _ask(client, tools=TOOLS[:2])  # another library evicts the first (one entry)
    _ask(client, tools=TOOLS)
    assert _metric(client, "hyfunc:library_cache_misses_total") == 3 and _metric(client, "hyfunc:library_cache_entries") == 1


def _many_tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Look up record number {i} of the archive",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
        for i in range(n)]


def test_a_library_over_128_tools_is_read_per_function(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from hyfunc.methods.direct import DirectMethod

    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path))  # where the per-function embeddings are cached
    cascade = tiny_cascade(library=True)
    tools = TOOLS + _many_tools(130)
    offered = {t["function"]["name"] for t in tools}
    # Embedded on the request path here (no background job: test_library_jobs.py).
    client = TestClient(create_app(cascade, ServeConfig(**CONFIG, library_jobs=0)))
    first, again = _ask(client, tools=tools), _ask(client, tools=tools)
    assert first.status_code == again.status_code == 200, first.text
    assert "library_build" in first.headers["server-timing"] and "library_build" not in again.headers["server-timing"]
    calls = first.json()["choices"][0]["message"]["tool_calls"]
    assert calls and {c["function"]["name"] for c in calls} <= offered
    state = cascade.library_state()
    assert state.joint is None and len(state.per_function.tools) == len(tools)
    assert _ask(client, tools=tools, tool_choice="required").status_code == 200
    # Bounded by max_tools; paths that read every tool in one prompt refuse such a library.
    too_many = _ask(TestClient(create_app(cascade, ServeConfig(**{**CONFIG, "max_tools": 100}))), tools=tools)
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_tools"
    direct = TestClient(create_app({"direct": DirectMethod(cascade.small, max_new_tokens=4)}, ServeConfig(**CONFIG)))
    refused = _ask(direct, tools=tools)
    assert refused.status_code == 400 and "per function" in refused.json()["error"]["message"]
    joint_only = TestClient(create_app(tiny_cascade(), ServeConfig(**CONFIG)))
    assert _ask(joint_only, tools=tools).json()["error"]["code"] == "too_many_tools"
    assert _ask(joint_only, tools=tools, tool_choice="none").status_code == 200  # a text reply reads no tool


def test_a_text_reply_that_opens_a_call_is_never_sent_as_text() -> None:
    from hyfunc.serving.replies import _Deltas

    sent: list[str] = []
    deltas = _Deltas(sent.append, hold_calls=True)
    call = '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    for end in range(1, len(call) + 1):
        deltas.feed(call[:end])
    assert deltas.finish(call) == ("", call.lstrip()) and sent == []
    answer = "It is 12 degrees in Oslo."
    streamed: list[str] = []
    deltas = _Deltas(streamed.append, hold_calls=True)
    for end in range(1, len(answer) + 1):
        deltas.feed(answer[:end])
    assert deltas.finish(answer) == (answer, "") and "".join(streamed) == answer
    # without tools a reply is text, whatever it looks like
    assert _Deltas(None, hold_calls=False).finish(call)[0] == call.lstrip()


def test_a_call_written_as_a_text_reply_is_made_or_replaced(cascade: Any) -> None:
    from hyfunc.serving.metrics import ServerMetrics
    from hyfunc.serving.replies import FALLBACK_TEXT
    from hyfunc.serving.service import ChatService, ServeConfig as Config

    service = ChatService({"cascade": cascade}, Config(**CONFIG), ServerMetrics())
    loop = [*HISTORY[1:4]]  # the Paris call was made and answered
    prepared = service.prepare(ChatCompletionRequest.model_validate({"model": "hyfunc", "messages": loop, "tools": TOOLS}))
    deltas: list[dict] = []
    new = '{"name": "get_weather", "arguments": {"city": "Berlin"}}'
    tool_calls, calls, text, finish = service._calls_in_reply(prepared, new, deltas.append, None, [])
    assert [c.arguments for c in calls] == [{"city": "Berlin"}] and text is None and finish == "tool_calls" and deltas
    texts: list[str] = []
    notes: list[str] = []
    repeat = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # answered already: not made again
    assert service._calls_in_reply(prepared, repeat, None, texts.append, notes) == ([], [], FALLBACK_TEXT, "stop")
    assert texts == [FALLBACK_TEXT] and any("not made" in n for n in notes)
