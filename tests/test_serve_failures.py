"""Failures: /health after a fatal model error (and not after a bad request), Retry-After from the
worker's observed service time."""
from __future__ import annotations

import threading
import time
from typing import Any

import torch
from fastapi.testclient import TestClient

from hyfunc.serving import ServeConfig, create_app
from hyfunc.serving.worker import ModelWorker
from tests.serve_app import tiny_cascade
from tests.test_serve_sdk import ASK, TOOLS

CONFIG = dict(context_tokens=4096, default_max_tokens=4)


def _ask(client: TestClient, **kwargs: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": ASK, **kwargs})


def test_health_fails_after_a_model_error_and_not_after_a_bad_request() -> None:
    cascade = tiny_cascade()
    client = TestClient(create_app(cascade, ServeConfig(**CONFIG)))
    assert _ask(client, tools=TOOLS).status_code == 200
    bad = client.post("/v1/chat/completions", content=b'{"model": "hyfunc", "messages": [', headers={"content-type": "application/json"})
    named = _ask(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert bad.status_code == named.status_code == 400
    assert client.get("/health").status_code == 200  # bad requests never reach the models
    # A real engine failure: the large model's embedding table no longer matches its layers, so
    # torch raises a RuntimeError in the middle of a forward pass.
    embed = cascade.large.model.get_input_embeddings()
    embed.weight = torch.nn.Parameter(torch.zeros(embed.weight.shape[0], 7))
    failed = _ask(client, tools=TOOLS)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "model_error"
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "failed" and "RuntimeError" in health.json()["detail"]
    for kwargs in ({"tools": TOOLS}, {"stream": True}):  # nothing more is answered from a broken state
        after = _ask(client, **kwargs)
        assert after.status_code == 503 and after.json()["error"]["code"] == "model_failed"


def test_retry_after_follows_the_observed_service_time() -> None:
    worker = ModelWorker(max_queue=0)
    assert worker.retry_after() == 1  # nothing observed yet
    worker.submit(lambda job: time.sleep(1.3), 10).future.result()
    assert worker.retry_after() == 2  # whole seconds, rounded up
    worker.shutdown()

    client = TestClient(create_app(tiny_cascade(), ServeConfig(**{**CONFIG, "max_queue": 0})))
    state = client.app.state.hyfunc
    state.worker.submit(lambda job: time.sleep(2.2), 10).future.result()
    gate = threading.Event()
    busy = state.worker.submit(lambda job: gate.wait(10), 10)  # the worker is busy, the queue (0) full
    try:
        refused = _ask(client, tools=TOOLS)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        gate.set()
        busy.future.result()
