"""Routing between the small path and the cascade: the Python API (RoutedMethod), a promoted
version picked up while running, rollback restoring the previous answers exactly, and the server
routing and logging each request (a real uvicorn process, a real PostgreSQL, the openai SDK)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hyfunc.formats.schema import parse_tools
from hyfunc.routing.routed import RoutedMethod
from hyfunc.routing.stores import open_store
from hyfunc.routing.versions import Metrics, Versions
from tests.odia_fixtures import LONG, SHORT, save_tiny_model, tiny_version
from tests.pg_server import Cluster, wait_until
from tests.serve_app import SMALL_HIDDEN, tiny_cascade
from tests.serve_process import running_server
from tests.test_serve_sdk import TOOLS


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("small") / "model", SMALL_HIDDEN, 2)


def _versions(root: Path, small_model: Path) -> tuple[Versions, str, str]:
    """v1 routes short requests to the small path; v2 routes nothing (threshold above 1)."""
    versions = Versions(root)
    metrics = Metrics(agreement=1.0, share=0.5, mean_latency=0.1)
    v1 = versions.create(lambda d: tiny_version(d, small_model), metrics=metrics, parents=[])
    v2 = versions.create(lambda d: tiny_version(d, small_model, threshold=1.01), metrics=metrics, parents=[v1])
    return versions, v1, v2


def test_routed_method_answers_by_path(tmp_path: Path, small_model: Path) -> None:
    versions, v1, _ = _versions(tmp_path / "odia", small_model)
    routed = RoutedMethod.load(tiny_cascade(), versions.path(v1))
    tools = parse_tools(TOOLS)
    short = routed.answer(_ask(SHORT), tools)
    assert short.details["path"] == "small" and short.details["version"] == v1
    assert "large_prefill" not in short.timings and {"select", "route"} <= set(short.timings)
    assert short.details["router_score"] >= routed.routing.router.threshold and short.calls
    long = routed.answer(_ask(LONG), tools)
    assert long.details["path"] == "cascade" and "large_prefill" in long.timings
    assert long.details["router_score"] < routed.routing.router.threshold
    assert routed.answer(_ask(SHORT), []).details["path"] == "cascade"  # nothing to call: no routing
    routed.explore = 1.0  # every small-path decision explored: the cascade answers, the log keeps its answer
    explored = routed.answer(_ask(SHORT), tools)
    assert explored.details["path"] == "cascade" and explored.details["explored"] and "large_prefill" in explored.timings
    with pytest.raises(FileNotFoundError, match="neither a versions directory"):
        RoutedMethod.load(routed.cascade, tmp_path)


def test_promotion_is_picked_up_and_rollback_restores_answers(tmp_path: Path, small_model: Path) -> None:
    versions, v1, v2 = _versions(tmp_path / "odia", small_model)
    routed = RoutedMethod.load(tiny_cascade(), versions.root, poll_seconds=0.0)
    tools = parse_tools(TOOLS)
    assert routed.routing.version is None and routed.answer(_ask(SHORT), tools).details["path"] == "cascade"
    versions.promote(v1)
    assert routed.wait_for(v1)
    first = [routed.answer(_ask(q), tools) for q in (SHORT, LONG)]
    assert [a.details["path"] for a in first] == ["small", "cascade"]
    versions.promote(v2)
    assert routed.wait_for(v2)
    assert routed.answer(_ask(SHORT), tools).details["path"] == "cascade"
    versions.rollback()
    assert routed.wait_for(v1)
    again = [routed.answer(_ask(q), tools) for q in (SHORT, LONG)]
    assert [(a.details["path"], a.calls) for a in again] == [(a.details["path"], a.calls) for a in first]
    # A version that cannot load leaves the current one serving.
    broken = versions.create(lambda d: tiny_version(d, small_model), metrics=versions.metrics(v1), parents=[v1])
    shutil.rmtree(versions.path(broken) / "router")
    versions.promote(broken)
    assert not routed.wait_for(broken, timeout=1.0) and routed.routing.version == v1


@pytest.fixture(scope="module")
def routed_server(postgres_cluster: Cluster, small_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = postgres_cluster.create_database("odia_routed")
    versions, v1, v2 = _versions(tmp_path_factory.mktemp("served") / "odia", small_model)
    versions.promote(v1)
    command = [sys.executable, "-m", "uvicorn", "--factory", "tests.odia_app:create", "--host", "127.0.0.1",
               "--port", "{port}", "--log-level", "warning"]
    with running_server({"traffic": url, "router": str(versions.root), "poll": 0.1}, command=command) as base:
        yield base, url, versions, v2


def test_the_server_routes_logs_and_switches_versions_live(routed_server: Any) -> None:
    base, url, versions, v2 = routed_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)

    def ask(text: str) -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=_ask(text), tools=TOOLS)
        assert raw.parse().choices[0].message.tool_calls
        return raw.headers["x-hyfunc-path"], raw.headers["x-request-id"]

    short_path, short_id = ask(SHORT)
    long_path, long_id = ask(LONG)
    assert (short_path, long_path) == ("small", "cascade")
    forced = client.chat.completions.with_raw_response.create(model="hyfunc", messages=_ask(SHORT), tools=TOOLS,
                                                              tool_choice="required")
    assert forced.headers["x-hyfunc-path"] == "cascade"  # forced calls keep the cascade's rules

    versions.promote(v2)  # routes nothing: picked up without a restart
    assert wait_until(lambda: ask(SHORT)[0] == "cascade", 30, interval=0.3)
    assert httpx.get(f"{base}/health", timeout=10).json()["traffic"]["written"] >= 2

    with open_store(url) as store:
        small, large = store.get(short_id).request, store.get(long_id).request
    assert small.path == "small" and "select" in small.timings and "large_prefill" not in small.timings
    assert small.models["method"].startswith("small@") and large.path == "cascade"


def test_the_server_serves_a_small_first_router(routed_server: Any, small_model: Path) -> None:
    """A router that reads the small path's answer: routed on the worker, after the small path has
    answered; the response and the log name the path that answered, an escalated request keeps
    what the small path cost."""
    base, url, versions, _ = routed_server
    champion = versions.champion
    v3 = versions.create(lambda d: tiny_version(d, small_model, small_first=True), metrics=versions.metrics(champion),
                         parents=[champion])
    versions.promote(v3)
    body = {"model": "hyfunc", "messages": _ask(SHORT), "tools": TOOLS}

    def arrival_route() -> str:  # a stream's header is sent on arrival: the route taken then
        with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
            response.read()
            return response.headers["x-hyfunc-path"]

    assert wait_until(lambda: arrival_route() == "small_first", 30, interval=0.3)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
    answered = {}
    for text in (SHORT, LONG):
        raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=_ask(text), tools=TOOLS)
        assert raw.parse().choices[0].message.tool_calls
        answered[text] = raw.headers["x-hyfunc-path"], raw.headers["x-request-id"]
    assert [answered[t][0] for t in (SHORT, LONG)] == ["small", "cascade"]
    with open_store(url) as store:
        short, long = store.get(answered[SHORT][1]).request, store.get(answered[LONG][1]).request
    assert short.path == "small" and short.models["method"].startswith("small@") and "large_prefill" not in short.timings
    assert long.path == "cascade" and "large_prefill" in long.timings and "tried_select" in long.timings


def test_hyfunc_call_routes_and_logs_the_path(tmp_path: Path, small_model: Path) -> None:
    import json

    from hyfunc.cli import main
    from tests.odia_fixtures import tiny_artifact

    versions, v1, _ = _versions(tmp_path / "odia", small_model)
    versions.promote(v1)
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    store = tmp_path / "traffic.sqlite"
    base = ["call", "--tools", str(tools), "--artifact", str(tiny_artifact(tmp_path / "cascade")),
            "--router", str(versions.root), "--traffic", str(store)]
    assert main(base + ["--query", SHORT]) == 0 and main(base + ["--query", LONG]) == 0
    with open_store(store) as opened:
        paths = {s.request.messages[0]["content"]: s.request.path for s in opened.iter_requests()}
    assert paths == {SHORT: "small", LONG: "cascade"}
    assert main(["call", "--tools", str(tools), "--query", SHORT, "--method", "direct", "--router", str(versions.root)]) == 2


def test_a_small_first_router_escalates_a_value_the_request_does_not_give(tmp_path: Path, small_model: Path) -> None:
    from hyfunc.formats.calls import Call
    from hyfunc.methods.base import Answer
    from tests.test_grounding import WEATHER

    version = tiny_version(tmp_path / "v", small_model, threshold=0.0, small_first=True)  # routes every answer
    routed = RoutedMethod.load(tiny_cascade(), version)
    tools = parse_tools([WEATHER])
    messages = _ask("Weather in Boston, MA?")
    copied = Answer([Call("get_current_weather", {"location": "Boston, MA"})], details={"confidence": 0.9})
    assert routed.choose(messages, tools, small_answer=copied)[0] == "small"
    bare = Answer([Call("get_current_weather", {"location": "Boston"})], details={"confidence": 0.9})
    assert routed.choose(messages, tools, small_answer=bare) == ("cascade", None)
    assert bare.details["escalated"] == [str(u) for u in routed.routing.router.escalations(messages, tools, bare.calls)]
    repeated = Answer([Call("get_current_weather", {"location": "Boston, MA"})] * 2,
                      details={"confidence": 0.9, "near_fit": ["get_forecast"]})
    assert routed.choose(messages, tools, small_answer=repeated) == ("cascade", None)
    assert "another nearly fits: get_forecast" in repeated.details["escalated"][0]
