"""Retrieve, then prompt: the wrapped method reads only the tools the selector keeps."""
from __future__ import annotations

from pathlib import Path

import pytest

from hyfunc.cascade.selector import ToolSelector
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.direct import DirectMethod
from hyfunc.methods.preselected import PreselectedMethod
from tests.odia_fixtures import permissive_selector
from tests.test_serve_sdk import TOOLS
from tests.tiny_models import tiny_backend

WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def selector(tmp_path_factory: pytest.TempPathFactory) -> ToolSelector:
    return ToolSelector.load(permissive_selector(tmp_path_factory.mktemp("sel") / "selector"))


def test_the_direct_model_reads_only_the_selected_tools(selector: ToolSelector) -> None:
    tools = parse_tools(TOOLS)
    method = PreselectedMethod(DirectMethod(tiny_backend(), max_new_tokens=4), selector)
    kept = [tools[i].name for i in selector.select(WEATHER[0]["content"], tools)]
    assert 0 < len(kept) < len(tools)  # the fixture keeps the fitting tools only
    answer = method.answer(WEATHER, tools)
    assert answer.details["selected_tools"] == kept and "select" in answer.timings
    assert "prefill" in answer.timings  # the wrapped model ran
    streamed: list[str] = []
    method.answer(WEATHER, tools, on_text=streamed.append)
    assert streamed  # the calls' text reaches a streaming caller


def test_no_fitting_tool_is_a_refusal_without_running_the_model(selector: ToolSelector, tmp_path: Path) -> None:
    refusing = ToolSelector.load(permissive_selector(tmp_path / "refusing"))
    refusing.retriever.config.refusal_threshold = float("inf")  # "no tool fits" for every request
    method = PreselectedMethod(DirectMethod(tiny_backend(), max_new_tokens=4), refusing)
    streamed: list[str] = []
    answer = method.answer(WEATHER, parse_tools(TOOLS), on_text=streamed.append)
    assert answer.calls == [] and answer.details["refused_by"] == "selector"
    assert list(answer.timings) == ["select"] and streamed == ["[]"]
