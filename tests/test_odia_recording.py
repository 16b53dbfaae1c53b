"""Logging answers outside the server: `RecordedMethod` (the Python API) and `hyfunc call --traffic`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import HyFuncMethod
from hyfunc.routing.recording import RecordedMethod
from hyfunc.routing.stores import open_store
from tests.odia_fixtures import ListSink, tiny_artifact
from tests.test_serve_sdk import ASK, TOOLS




@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_artifact(tmp_path_factory.mktemp("odia") / "cascade")


def test_a_recorded_method_logs_what_it_answered(artifact: Path) -> None:
    cascade = HyFuncMethod.load(artifact)
    sink = ListSink()
    method = RecordedMethod(cascade, sink)
    assert method.large is cascade.large  # the rest of the method is reachable (use_library, models)
    answer = method.answer(ASK, parse_tools(TOOLS))
    (record,) = sink.records
    assert answer.details["request_id"] == record.request_id and record.path == "cascade"
    assert record.calls == [{"name": c.name, "arguments": c.arguments} for c in answer.calls] and record.calls
    assert [t["function"]["name"] for t in record.tools] == [t["function"]["name"] for t in TOOLS]
    assert record.timings == answer.timings and record.models["large"].endswith("cascade-large")
    failing = RecordedMethod(cascade, ListSink(fail=True)).answer(ASK, parse_tools(TOOLS))
    assert failing.calls == answer.calls and "disk full" in failing.details["traffic_error"]


def test_hyfunc_call_logs_with_traffic(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    store = tmp_path / "traffic.sqlite"
    args = ["call", "--tools", str(tools), "--query", ASK[0]["content"], "--artifact", str(artifact),
            "--engine", "transformers"]
    assert main(args) == 0
    assert not store.exists()  # off by default
    assert main(args + ["--traffic", str(store)]) == 0
    captured = capsys.readouterr()
    with open_store(store) as opened:
        (stored,) = list(opened.iter_requests())
    assert f"logged as {stored.request.request_id}" in captured.err
    printed = json.loads(captured.out.strip().splitlines()[-1])["calls"]
    assert [next(iter(c)) for c in printed] == [c["name"] for c in stored.request.calls]
    assert main(args + ["--traffic", "mysql://nope"]) == 2 and "unsupported store URL" in capsys.readouterr().err
