"""Learning from traffic, wired into the server: a real uvicorn process around a tiny random
cascade logs every answer to a real PostgreSQL server, takes feedback on the id it returned
(`x-request-id`), and reports the log's health; driven by the official `openai` SDK."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hyfunc.routing.recording import traffic_log
from hyfunc.routing.stores import open_store
from tests.pg_server import Cluster, wait_until
from tests.serve_process import running_server
from tests.test_serve_sdk import ASK, TOOLS

KEY = "odia-key"


@pytest.fixture(scope="module")
def logged_server(postgres_cluster: Cluster) -> Any:
    url = postgres_cluster.create_database("odia_serve")
    command = [sys.executable, "-m", "uvicorn", "--factory", "tests.odia_app:create", "--host", "127.0.0.1",
               "--port", "{port}", "--log-level", "warning"]
    with running_server({"traffic": url, "api_key": KEY}, command=command) as base:
        yield base, url


def _feedback(base: str, body: Any, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{base}/v1/feedback", content=content, headers={**headers, "content-type": "application/json"},
                      timeout=30)


def test_answers_land_in_the_store_and_feedback_on_their_id(logged_server: Any) -> None:
    base, url = logged_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=ASK, tools=TOOLS)
    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert completion.id == request_id
    # At once: the answer may still be queued in the log; the feedback route waits for it.
    reply = _feedback(base, {"request_id": request_id, "feedback": "good"})
    assert reply.status_code == 200 and reply.json() == {"request_id": request_id, "feedback": "good"}

    chunks = list(client.chat.completions.create(model="hyfunc", messages=ASK, stream=True))
    streamed_id = chunks[0].id
    assert _feedback(base, {"request_id": streamed_id, "feedback": "bad"}).status_code == 200

    with open_store(url) as store:
        stored = store.get(request_id)
        served = stored.request
        assert stored.feedback == "good" and served.path == "cascade" and served.models["large"] == "tiny"
        assert served.messages == ASK and [t["function"]["name"] for t in served.tools] == [
            t["function"]["name"] for t in TOOLS]
        sent = [(c.function.name, json.loads(c.function.arguments)) for c in completion.choices[0].message.tool_calls]
        assert [(c["name"], c["arguments"]) for c in served.calls] == sent
        assert served.timings["large_prefill"] > 0 and served.input_tokens == completion.usage.prompt_tokens
        text_reply = store.get(streamed_id)
        assert text_reply.feedback == "bad" and text_reply.request.calls == [] and text_reply.request.text

    def health() -> dict:
        return httpx.get(f"{base}/health", timeout=10).json()["traffic"]

    assert wait_until(lambda: health()["written"] >= 2, 10)
    counts = health()
    assert counts["dropped"] == counts["lost"] == counts["rejected"] == 0 and counts["ok"]
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    written = next(line for line in metrics.splitlines() if line.startswith("hyfunc:traffic_log_written_total"))
    assert float(written.split()[-1]) >= 2


def test_feedback_errors(logged_server: Any) -> None:
    base, _ = logged_server
    unknown = _feedback(base, {"request_id": "chatcmpl-nope", "feedback": "good"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_request_id"
    verdict = _feedback(base, {"request_id": "chatcmpl-nope", "feedback": "meh"})
    assert verdict.status_code == 400 and verdict.json()["error"]["param"] == "feedback"
    assert _feedback(base, b"{not json").status_code == 400
    assert _feedback(base, [1, 2]).status_code == 400
    assert _feedback(base, {"request_id": 7, "feedback": "good"}).status_code == 400
    assert _feedback(base, {"request_id": "x", "feedback": "good"}, key=None).status_code == 401


def test_bare_flag_is_the_embedded_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path))
    assert traffic_log(None) is None  # off unless asked for
    log = traffic_log("")
    try:
        assert Path(log.store.url) == tmp_path / "traffic.sqlite"
    finally:
        log.close()


def test_fuzzed_feedback_gets_no_server_error(logged_server: Any, tmp_path: Path) -> None:
    """Schemathesis on the feedback route of the server's own OpenAPI schema: never a 5xx."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    from hyfunc.routing.traffic import TrafficLog
    from hyfunc.serving import ServeConfig, create_app

    base, _ = logged_server
    log = TrafficLog(tmp_path / "schema.sqlite")  # the route exists only with a log: the schema says so
    try:
        schema = schemathesis.openapi.from_dict(create_app(lambda: None, ServeConfig(), traffic=log).openapi())
    finally:
        log.close()
    (operation,) = [r.ok() for r in schema.get_all_operations() if r.ok().path == "/v1/feedback"]
    statuses: list[int] = []

    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def send(case: Any) -> None:
        response = case.call(base_url=base, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        statuses.append(response.status_code)
        assert response.status_code < 500, (case.body, response.text)

    send()
    assert statuses and set(statuses) <= {200, 400, 404}
