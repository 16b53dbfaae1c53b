"""New libraries too large for one prompt, embedded between requests (serving/library_jobs.py):
429 with Retry-After until their embeddings are on disk, in steps that requests overtake; bounded,
and dropped when nobody asks any more (tiny random models, in process)."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyfunc.cascade import library
from hyfunc.cascade.library import LibraryEmbedding, embeddings_stored, library_embeddings
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.formats.schema import parse_tool, parse_tools
from hyfunc.serving import ServeConfig, create_app
from hyfunc.serving.errors import APIError
from hyfunc.serving.library_jobs import LibraryJobs
from hyfunc.serving.metrics import ServerMetrics
from hyfunc.serving.worker import ModelWorker
from tests.serve_app import tiny_cascade
from tests.test_serve_sdk import ASK, TOOLS
from tests.test_serve_units import _many_tools
from tests.tiny_models import tiny_backend

CONFIG = dict(context_tokens=4096, default_max_tokens=4)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path))  # where the per-function embeddings are cached
    return tmp_path


def _ask(client: TestClient, tools: list[dict]) -> Any:
    return client.post("/v1/chat/completions", json={"model": "hyfunc", "messages": ASK, "tools": tools})


def _until_served(client: TestClient, tools: list[dict], seconds: float = 120) -> tuple[Any, list[Any]]:
    """The first answer that is not a 429, and the 429s before it."""
    refusals, deadline = [], time.monotonic() + seconds
    while (response := _ask(client, tools)).status_code == 429 and time.monotonic() < deadline:
        refusals.append(response)
        time.sleep(0.02)
    return response, refusals


def _metric(client: TestClient, name: str) -> float:
    return float(next(line.split()[-1] for line in client.get("/metrics").text.splitlines() if line.startswith(name)))


def _hold(worker: ModelWorker) -> threading.Event:
    """Keep the model worker busy with a request until the event is set."""
    release = threading.Event()
    worker.submit(lambda job: release.wait(60), timeout=120)
    return release


def test_a_library_embedded_a_few_tools_at_a_time_equals_one_embedded_at_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library, "SHARD_SIZE", 4)
    encoder = SoftTokenEncoder(tiny_backend(hidden_size=16, seed=1))
    tools = parse_tools([{"name": f"f_{i}", "description": f"tool number {i}" + " and more" * i} for i in range(10)])
    embedding = LibraryEmbedding(encoder, tools)
    assert embedding.remaining == 10
    assert embedding.step(3) == 3 and embedding.remaining == 7
    assert not list(embedding.directory.glob("*.safetensors"))  # a shard is written whole or not at all
    assert embedding.step(3) == 1  # the rest of the first shard
    assert len(list(embedding.directory.glob("*.safetensors"))) == 1 and embedding.remaining == 6
    while embedding.step(3):
        pass
    assert embedding.remaining == 0 and embeddings_stored(encoder, tools)
    stepped = embedding.load()
    for shard in embedding.directory.glob("*.safetensors"):
        shard.unlink()
    assert library_embeddings(encoder, tools).allclose(stepped, atol=1e-5)


def test_a_new_large_library_is_429_until_embedded_and_other_requests_are_served_meanwhile(home: Path) -> None:
    client = TestClient(create_app(tiny_cascade(library=True), ServeConfig(**CONFIG)))
    tools = TOOLS + _many_tools(140)
    release = _hold(client.app.state.hyfunc.worker)
    first = _ask(client, tools)
    assert first.status_code == 429, first.text
    error = first.json()["error"]
    assert (error["param"], error["code"]) == ("tools", "library_embedding")
    assert "143 tools are new to this server" in error["message"] and "(0 of 143 done)" in error["message"]
    assert int(first.headers["retry-after"]) >= 1
    release.set()
    assert _ask(client, TOOLS).status_code == 200  # a library read in one prompt: served as always
    served, refusals = _until_served(client, tools)
    assert served.status_code == 200, served.text
    assert all(r.json()["error"]["code"] == "library_embedding" for r in refusals)
    assert "library_build" in served.headers["server-timing"]  # read from disk, its state built once
    assert _metric(client, "hyfunc:library_job_tools_total") == 143 and _metric(client, "hyfunc:library_jobs") == 0
    cascade = client.app.state.hyfunc.service.methods["cascade"]
    assert embeddings_stored(cascade.encoder, [parse_tool(t) for t in tools])


def test_a_request_waits_behind_one_step_of_a_job_at_most(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    step = LibraryEmbedding.step

    def recorded(self: LibraryEmbedding, max_tools: int) -> int:
        order.append("step")
        return step(self, max_tools)

    monkeypatch.setattr(LibraryEmbedding, "step", recorded)
    client = TestClient(create_app(tiny_cascade(library=True), ServeConfig(**CONFIG)))
    worker = client.app.state.hyfunc.worker
    release = _hold(worker)
    assert _ask(client, TOOLS + _many_tools(140)).status_code == 429  # its first step queues behind the held request
    request = worker.submit(lambda job: order.append("request"), timeout=60)  # arrives while that step waits
    release.set()
    request.future.result(timeout=60)
    while client.app.state.hyfunc.service.jobs.running:
        time.sleep(0.01)
    assert order[:3] == ["step", "request", "step"] and order.count("request") == 1


def test_jobs_are_bounded_and_a_second_library_waits_its_turn(home: Path) -> None:
    client = TestClient(create_app(tiny_cascade(library=True), ServeConfig(**CONFIG, library_jobs=1)))
    first, second = TOOLS + _many_tools(140), TOOLS + _many_tools(141)
    release = _hold(client.app.state.hyfunc.worker)
    assert _ask(client, first).json()["error"]["code"] == "library_embedding"
    full = _ask(client, second)
    assert full.status_code == 429 and full.json()["error"]["code"] == "library_jobs_full"
    assert "already embedding 1 other new libraries" in full.json()["error"]["message"] and int(full.headers["retry-after"]) >= 1
    release.set()
    for tools in (first, second):
        served, _ = _until_served(client, tools)
        assert served.status_code == 200, served.text


def test_a_job_nobody_asks_about_any_more_is_dropped(home: Path) -> None:
    cascade = tiny_cascade(library=True)
    tools = parse_tools([t["function"] for t in TOOLS + _many_tools(140)])
    worker, metrics, errors = ModelWorker(4), ServerMetrics(), []
    now = [0.0]
    jobs = LibraryJobs(worker.submit_background, worker.mean_service_seconds, 2, 5.0, metrics, errors.append, lambda: now[0])
    release = _hold(worker)
    with pytest.raises(APIError) as refused:
        jobs.admit(cascade, tools, library.DISK_CACHE_BYTES)
    retry = int(refused.value.headers["Retry-After"])
    now[0] = retry + 5.0 + 1  # its client did not come back within the grace after the Retry-After it got
    release.set()
    deadline = time.monotonic() + 60
    while jobs.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert jobs.running == 0 and errors == []
    assert not embeddings_stored(cascade.encoder, tools) and metrics.registry.get_sample_value("hyfunc:library_job_tools_total") == 0
    worker.shutdown()


def test_without_jobs_a_new_library_is_embedded_on_the_request_path(home: Path) -> None:
    client = TestClient(create_app(tiny_cascade(library=True), ServeConfig(**CONFIG, library_jobs=0)))
    response = _ask(client, TOOLS + _many_tools(140))
    assert response.status_code == 200, response.text
