"""The trained default cascade shipped in hyfunc/data/cascade, on the real models (its manifest names them)."""
import json

import pytest

from hyfunc.methods.cascade import DEFAULT_ARTIFACT
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors
from hyfunc.methods import load_method

pytestmark = pytest.mark.integration

DEMO_TOOLS = parse_tools(json.loads((DEFAULT_ARTIFACT.parent / "demo.json").read_text())["tools"])


@pytest.fixture(scope="module")
def cascade():
    return load_method("hyfunc")


def test_manifest_records_models_data_and_metrics():
    manifest = json.loads((DEFAULT_ARTIFACT / "manifest.json").read_text())
    assert manifest["format"] == "hyfunc-cascade"
    assert manifest["large_model"] == "qwen-coder-1.5b" and manifest["models"]["large"]["gguf_sha256"]
    assert len(manifest["data"]["sha256"]) == 64 and manifest["data"]["train"] > 0
    assert "recall@1" in manifest["metrics"]["retriever"]["validation"]
    total = sum(p.stat().st_size for p in DEFAULT_ARTIFACT.rglob("*") if p.is_file())
    assert total < 75e6  # weights that travel with the code stay small (two adapters and projectors: 68 MB)


def test_a_real_request_is_answered_by_the_cascade(cascade):
    answer = cascade.answer([{"role": "user", "content": "What's the weather in Tokyo right now, in fahrenheit?"}], DEMO_TOOLS)
    assert answer.error is None and len(answer.calls) >= 1
    call = answer.calls[0]
    assert call.name == "get_weather" and argument_errors(call, DEMO_TOOLS) == []
    assert "tokyo" in str(call.arguments.get("city", "")).lower()
    assert {"large_prefill", "retrieve", "small_prefill", "small_decode"} <= set(answer.timings)
    assert answer.injected_tokens > 0 and answer.output_tokens > 0


def test_small_talk_is_refused_by_the_off_topic_gate_and_tool_requests_are_not(cascade):
    manifest = json.loads((DEFAULT_ARTIFACT / "manifest.json").read_text())
    assert manifest["metrics"]["off_topic_gate"]["validation"]["call_refused_by_gate"] <= 0.02
    joke = cascade.answer([{"role": "user", "content": "Tell me a joke about cats."}], DEMO_TOOLS)
    assert joke.calls == [] and joke.details["refused_by"] == "off_topic_gate"
    money = cascade.answer([{"role": "user", "content": "How much is 250 US dollars in euros?"}], DEMO_TOOLS)
    assert [c.name for c in money.calls] == ["convert_currency"]


def _after_results(request: str, *calls: tuple[str, dict, str]) -> list[dict]:
    """The conversation an agent sends back: the request, the calls made, one result per call."""
    wire = [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args, _) in enumerate(calls)]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": result} for i, (_, _, result) in enumerate(calls)]
    return [{"role": "user", "content": request}, {"role": "assistant", "content": None, "tool_calls": wire}, *results]


def test_after_tool_results_the_cascade_answers_when_done_and_calls_when_not(cascade):
    assert (DEFAULT_ARTIFACT / "next_step" / "manifest.json").is_file()
    done = cascade.answer(_after_results(
        "What's the weather in Lisbon, in fahrenheit?",
        ("get_weather", {"city": "Lisbon", "unit": "fahrenheit"}, "75 degrees fahrenheit, sunny"),
    ), DEMO_TOOLS)
    assert done.calls == [] and done.details["next_step"] == "answer"
    # half done: the second city is still open
    open_ = cascade.answer(_after_results(
        "What's the weather in Oslo? And how much is 100 US dollars in Norwegian kroner?",
        ("get_weather", {"city": "Oslo"}, '{"temperature": 12, "unit": "celsius", "sky": "light rain"}'),
    ), DEMO_TOOLS)
    # the decision is the head's; which call follows is the retriever's and the after-results small model's
    assert open_.details["next_step"] == "call" and open_.details["small_model"] == "after_results"
    assert [c.name for c in open_.calls] == ["convert_currency"]
