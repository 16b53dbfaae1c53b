"""Bad input gets a 4xx in OpenAI's envelope, never a 500; the queue answers 429 when full.
Driven through the official `openai` SDK (its typed exceptions) and raw HTTP where the SDK
cannot send the bad bytes."""
from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.serve_process import running_server
from tests.test_serve_sdk import ASK, TOOLS

KEY = "k3y"
LIMIT = 32 * 1024


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server({"method": "cascade", "api_key": KEY, "max_body_bytes": LIMIT}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def _envelope(err: openai.APIStatusError, status: int, param: str | None = None) -> dict:
    assert err.status_code == status
    error = err.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if status in (400, 404, 413):
        assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    return error


def _tool(name: str, parameters: Any = None) -> dict:
    function = {"name": name, "description": "d"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


BAD_REQUESTS = {
    "empty-messages": ({"messages": []}, "messages"),
    "wrong-type": ({"messages": ASK, "max_tokens": "5"}, "max_tokens"),
    "stream-not-bool": ({"messages": ASK, "stream": "yes"}, "stream"),
    "bad-role": ({"messages": [{"role": "robot", "content": "hi"}]}, None),
    "no-user-message": ({"messages": [{"role": "system", "content": "be brief"}]}, "messages"),
    "ends-with-assistant": ({"messages": [*ASK, {"role": "assistant", "content": "ok"}]}, "messages[1]"),
    "orphan-tool-result": ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "1"}]},
                           "messages[1].tool_call_id"),
    "image-part": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                   "messages[0].content[0].type"),
    "invalid-schema": ({"messages": ASK, "tools": [*TOOLS, _tool("f", {"type": "object", "properties": {"x": {"type": "banana"}}})]},
                       "tools[3].function"),
    "duplicate-tools": ({"messages": ASK, "tools": [*TOOLS, TOOLS[0]]}, "tools[3].function.name"),
    "choice-not-offered": ({"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                           "tool_choice.function.name"),
    "choice-without-tools": ({"messages": ASK, "tool_choice": "required"}, "tool_choice"),
    "two-choices": ({"messages": ASK, "n": 2}, "n"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
def test_bad_requests_are_400_in_openais_envelope(client: openai.OpenAI, case: str) -> None:
    body, param = BAD_REQUESTS[case]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="hyfunc", **body)
    error = _envelope(info.value, 400, param)
    if case == "invalid-schema":  # the message names the tool and the field
        assert "'f'" in error["message"] and "x" in error["message"] and "banana" in error["message"]


def test_unknown_fields_are_ignored(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="hyfunc", messages=ASK, max_tokens=3, extra_body={"logprobs": False, "store": True, "some_new_field": {"a": 1}})
    assert done.choices[0].message.content


@pytest.mark.parametrize("body,what", [
    (b'{"model": "hyfunc", "messages": [', "not valid JSON"),
    (b'{"model": "hyfunc", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
    (b"[1, 2]", "JSON object"),
    (b"", "empty"),
    (b'{"model": "hyfunc", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN"),
])
def test_bytes_that_are_not_a_request(server: str, body: bytes, what: str) -> None:
    r = httpx.post(f"{server}/v1/chat/completions", content=body,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400 and what in r.json()["error"]["message"]


def test_oversize_body_is_413(client: openai.OpenAI, server: str) -> None:
    big = [{"role": "user", "content": "x" * (LIMIT + 10)}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="hyfunc", messages=big)
    _envelope(info.value, 413)

    def chunks() -> Any:  # no content-length: the limit holds while the body streams in
        for _ in range(LIMIT // 1024 + 2):
            yield b" " * 1024

    r = httpx.post(f"{server}/v1/chat/completions", content=chunks(), headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_model_and_route_are_404(client: openai.OpenAI, server: str) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=ASK)
    assert _envelope(info.value, 404, "model")["code"] == "model_not_found"
    r = httpx.get(f"{server}/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def test_wrong_or_missing_key_is_401(server: str) -> None:
    for key in ("wrong", KEY + "x", "k3"):
        bad = openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.chat.completions.create(model="hyfunc", messages=ASK)
        _envelope(info.value, 401)
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert httpx.get(f"{server}/health").status_code == 200  # health and metrics stay open for probes


def test_429_with_retry_after_past_the_queue() -> None:
    # One request runs (slowly: the method waits 3 s; it is asked only when tools are given),
    # one waits (max_queue 1): a third is refused at once.
    with running_server({"method": "direct", "slow": 3, "max_queue": 1}) as url:
        results: list[int] = []

        def send() -> None:
            results.append(httpx.post(f"{url}/v1/chat/completions", json={"model": "hyfunc", "messages": ASK, "tools": TOOLS, "max_tokens": 2},
                                      timeout=60).status_code)

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # both admitted: one running, one queued
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="hyfunc", messages=ASK)
        assert time.monotonic() - started < 1.0  # refused at once, not after waiting
        assert info.value.response.headers["retry-after"] == "1"
        assert info.value.response.json()["error"]["code"] == "queue_full"
        for thread in threads:
            thread.join()
        assert results == [200, 200]
        assert 'hyfunc:requests_rejected_total 1.0' in httpx.get(f"{url}/metrics").text
