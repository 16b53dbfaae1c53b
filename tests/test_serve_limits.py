"""Serving under load: liveness apart from readiness (a real server whose worker is held busy), the
cap on the tokens of a tool library no cache holds (413 before the queue), and requests given up
midway (client gone, time limit) stopping at their next model step."""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from hyfunc.formats.schema import parse_tool
from hyfunc.serving import ServeConfig, create_app
from tests.serve_app import tiny_cascade
from tests.serve_process import running_server
from tests.test_serve_sdk import ASK, TOOLS

CONFIG = dict(context_tokens=4096, default_max_tokens=4)


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_ready_degrades_while_the_oldest_request_waits_too_long_and_live_stays_up() -> None:
    # One request runs for 3 s (the method waits; it is asked only when tools are given), the next waits behind it.
    with running_server({"method": "direct", "slow": 3, "max_queue": 2, "ready_max_wait": 0.5}) as url:
        assert httpx.get(f"{url}/health/ready").json() == {"status": "ready", "detail": None}
        statuses: list[int] = []

        def send() -> None:
            body = {"model": "hyfunc", "messages": ASK, "tools": TOOLS, "max_tokens": 2}
            statuses.append(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code)

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 2.5
        while (ready := httpx.get(f"{url}/health/ready")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.status_code == 503 and ready.json()["status"] == "degraded", ready.text
        assert "the oldest queued request has waited" in ready.json()["detail"]
        assert httpx.get(f"{url}/health/live").json() == {"status": "live"}
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # as before: loaded and sound
        assert _gauge(url, "hyfunc:queue_oldest_wait_seconds") > 0.5
        for thread in threads:
            thread.join()
        assert statuses == [200, 200]
        assert httpx.get(f"{url}/health/ready").status_code == 200  # the queue drained: ready again
        assert _gauge(url, "hyfunc:queue_oldest_wait_seconds") == 0.0


def _ask(client: TestClient, **kwargs: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": ASK, **kwargs})


def _refused(response: Any) -> str:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "tools", "too_many_tool_tokens")
    assert "--max-new-tool-tokens" in error["message"]
    return error["message"]


def test_a_new_library_over_the_cap_is_413_and_a_cached_one_is_not_counted() -> None:
    config = ServeConfig(**CONFIG, max_new_tool_tokens=1)
    client = TestClient(create_app(tiny_cascade(), config))
    message = _refused(_ask(client, tools=TOOLS))
    assert re.search(r"the first 1 of its 3 tools take \d+ tokens, more than its cap of 1 new tool tokens", message)
    service = client.app.state.hyfunc.service
    # Counted as the model's tokenizer reads each tool's JSON schema.
    total = sum(service.count(json.dumps(parse_tool(t).to_json_schema(), ensure_ascii=False)) for t in TOOLS)
    config.max_new_tool_tokens = total - 1  # the running server's config: a cap just under the library
    assert f"its 3 tools take {total} tokens, more than its cap of {total - 1}" in _refused(_ask(client, tools=TOOLS))
    # Nothing is read anew for a text reply (tool_choice none) or a named call (one tool, within the context).
    assert _ask(client, tools=TOOLS, tool_choice="none").status_code == 200
    assert _ask(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ping"}}).status_code == 200
    config.max_new_tool_tokens = total
    assert _ask(client, tools=TOOLS).status_code == 200  # at the cap: served, and its state cached
    config.max_new_tool_tokens = 1
    assert _ask(client, tools=TOOLS).status_code == 200  # cached: it costs nothing new
    _refused(_ask(client, tools=TOOLS[:2]))  # another library is new
    assert 'hyfunc:requests_total{status="413"} 3.0' in client.get("/metrics").text


def test_a_library_whose_embeddings_are_on_disk_is_not_new(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path))  # where the per-function embeddings are cached
    cascade = tiny_cascade(library=True)
    library = TOOLS + [{"type": "function", "function": {"name": f"record_{i}", "description": f"Look up record {i}"}}
                       for i in range(130)]  # over 128 tools: read per function
    assert _ask(TestClient(create_app(cascade, ServeConfig(**CONFIG, library_jobs=0))), tools=library).status_code == 200
    # Another server on the same disk: its memory cache is empty, the embeddings are on disk.
    capped = TestClient(create_app(cascade, ServeConfig(**CONFIG, max_new_tool_tokens=1)))
    assert _ask(capped, tools=library).status_code == 200
    _refused(_ask(capped, tools=library[:-1]))


STEP_SECONDS = 0.05  # each model step of the tiny cascade waits this long: a request of ~120 steps takes seconds
MANY_STEPS = {"model": "hyfunc", "messages": ASK, "tools": TOOLS, "max_tokens": 4}


def _settles(url: str, name: str, value: float, within: float) -> bool:
    deadline = time.monotonic() + within
    while _gauge(url, name) != value:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_client_leaves_stops_at_its_next_model_step(stream: bool) -> None:
    with running_server({"slow_steps": STEP_SECONDS}) as url:
        start = time.monotonic()
        assert httpx.post(f"{url}/v1/chat/completions", json=MANY_STEPS, timeout=120).status_code == 200
        whole = time.monotonic() - start
        assert whole > 4  # the premise: a request long enough to be given up midway
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s and closes the connection
            with httpx.stream("POST", f"{url}/v1/chat/completions", json={**MANY_STEPS, "stream": stream}, timeout=1.0) as r:
                for _ in r.iter_lines():
                    pass
        # Noticed within the worker's poll (0.25 s), stopped before the next step: far sooner than the rest of the request.
        assert _settles(url, "hyfunc:num_requests_running", 0.0, within=1.5)
        assert _gauge(url, "hyfunc:requests_stopped_total") == 1.0
        assert httpx.post(f"{url}/v1/chat/completions", json=MANY_STEPS, timeout=120).status_code == 200  # serves on


def test_a_request_past_its_time_limit_is_504_and_stops_at_its_next_model_step() -> None:
    with running_server({"slow_steps": STEP_SECONDS, "request_timeout": 1.0}) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=MANY_STEPS, timeout=60)
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout", response.text
        assert _settles(url, "hyfunc:num_requests_running", 0.0, within=1.0)
        assert _gauge(url, "hyfunc:requests_stopped_total") == 1.0
