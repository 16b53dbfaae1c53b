"""`hyfunc bench agent`: the lenient matching and the scoring on hand-made replies, the shipped task
set's shape, and the whole loop against a real (tiny random-model) server process."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.eval.agent_bench import (
    MAX_REQUESTS,
    Expected,
    TaskResult,
    call_matches,
    load_tasks,
    markdown,
    plot,
    score,
    script_for,
    server_timing,
    summary,
    value_matches,
)
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tool
from hyfunc.formats.validate import argument_errors
from tests.serve_process import free_port, running_server

TASKS = load_tasks()
BY_ID = {t.id: t for t in TASKS}


# --- matching ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("expected", "made"), [
    ("Paris", "  paris "), ("New  York", "new york"), (250, 250.0), (250, "250"), ("94107", 94107), (2.4, 2.4000000000001),
    (True, True), ({"one_of": ["kg", "kilograms"]}, "Kilograms"), (["a", 1], ["A", 1.0]), ({"x": "a"}, {"x": "A", "y": 2}),
])
def test_values_that_match(expected, made):
    assert value_matches(expected, made)


@pytest.mark.parametrize(("expected", "made"), [
    ("Paris", "Paris, France"), (250, 251), (250, "two hundred fifty"), (True, 1), (1, True), (True, "true"),
    ({"one_of": ["kg", "kilograms"]}, "lb"), (["a"], ["a", "b"]), ({"x": "a"}, {"y": "a"}), ("a", None),
])
def test_values_that_do_not_match(expected, made):
    assert not value_matches(expected, made)


def test_a_call_matches_by_exact_name_and_the_expected_arguments_only():
    expected = Expected("get_weather", {"city": "Paris"}, "12°C")
    assert call_matches(expected, "get_weather", {"city": "PARIS", "unit": "celsius"})  # optional arg ignored
    assert not call_matches(expected, "Get_Weather", {"city": "Paris"})
    assert not call_matches(expected, "get_weather", {"unit": "celsius"})
    assert not call_matches(expected, "get_weather", '{"city": "Paris"')  # arguments that were not JSON


# --- scoring ----------------------------------------------------------------------------------

WEATHER = BY_ID["weather-two-cities"]  # Paris + Berlin; facts 12, rain, 8, overcast
BOTH = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "berlin"}}]
GOOD = "Paris has rain showers at 12°C, while Berlin is overcast at 8°C."


def test_a_correct_loop_scores_no_failure():
    assert score(WEATHER, BOTH, GOOD) == []
    assert score(WEATHER, list(reversed(BOTH)), GOOD.upper()) == []  # any order; facts case-insensitive


def test_each_failure_is_named():
    assert score(WEATHER, BOTH[:1], GOOD) == ['missing call get_weather({"city": "Berlin"})']
    # the same call twice covers one expected call, not two
    assert score(WEATHER, [BOTH[0], BOTH[0]], GOOD) == ['missing call get_weather({"city": "Berlin"})']
    extra = BOTH + [{"name": "get_air_quality", "arguments": {"city": "Paris"}}]
    assert score(WEATHER, extra, GOOD) == ['unscripted call get_air_quality({"city": "Paris"})']
    assert score(WEATHER, BOTH, "Paris: 12°C and rain. Berlin: 8°C.") == ["missing fact 'overcast'"]
    assert score(WEATHER, BOTH, None) == [f"no text answer after {MAX_REQUESTS} requests"]


@pytest.mark.parametrize("markup", [
    '<tool_call>{"name": "get_weather"}</tool_call>', 'Assistant called get_weather({"city": "Paris"})',
    "Result of get_weather: 12°C", "Done so far for this request:", "<|im_end|>", "User: and in Rome?",
])
def test_transcript_markup_in_the_answer_fails_it(markup):
    failures = score(WEATHER, BOTH, f"{GOOD}\n{markup}")
    assert len(failures) == 1 and failures[0].startswith("transcript markup in the answer")


def test_script_for_gives_the_canned_result_of_the_matching_call():
    task = BY_ID["order-then-track"]
    found = script_for(task, "track_package", {"tracking_number": "1z84f2390311", "carrier": "ups"})
    assert found is not None and "out for delivery" in found.result_text()
    assert json.loads(script_for(task, "lookup_order", {"order_number": "A-10442"}).result_text())["carrier"] == "ups"
    assert script_for(task, "track_package", {"tracking_number": "0000"}) is None


def test_server_timing_header_reads_as_seconds_per_stage():
    assert server_timing("direct;dur=1500.0, text_reply;dur=20.5") == {"direct": 1.5, "text_reply": 0.0205}
    assert server_timing("") == {}


def test_the_report_compares_servers_on_the_same_tasks_even_when_one_was_cut_short(tmp_path: Path):
    def result(task: str, correct: bool, latencies: list[float]) -> dict:
        return asdict(TaskResult(task, correct, None if correct else "missing fact '12'", len(latencies), latencies,
                                 sum(latencies), [{"text_reply": 0.5}] * len(latencies), "answer"))

    first = [result("a", True, [1.0, 2.0]), result("b", False, [4.0]), result("c", True, [1.0, 1.0])]
    second = [result("a", True, [0.5, 0.5]), result("b", True, [1.0])]  # stopped before task c
    report = {"command": "hyfunc bench agent", "git": {"commit": None, "dirty": None},
              "machine": {"model": "cpu", "cores": 2, "speed_flags": ["avx2"]}, "max_requests": MAX_REQUESTS,
              "tasks": [{"id": t, "kind": "parallel"} for t in "abc"], "servers": []}
    for label, results in (("one", first), ("two", second)):
        report["servers"].append({"label": label, "url": "u", "results": results, "summary": summary(results, first)})
    one, two = (s["summary"] for s in report["servers"])
    assert (one["correct"], one["n"], one["total_latency_s"], one["median_latency_s"], one["median_requests"]) == (2, 3, 9.0, 3.0, 2)
    assert one["total_vs_first"] == 1.0 and one["server_stages_s"] == {"text_reply": 2.5}  # 5 requests
    assert two["total_vs_first"] == round(2.0 / 7.0, 3)  # against the first server's same two tasks
    md = markdown(report)
    assert "| one | u | 2/3 |" in md and "| c | parallel | ✓ (2.00 s, 2 req) | not run |" in md
    assert "✗ missing fact '12' (4.00 s, 1 req)" in md
    plot(report, tmp_path / "agent.png")
    assert (tmp_path / "agent.png").stat().st_size > 0


# --- the task set -----------------------------------------------------------------------------

def _concrete(arguments: dict, pick: int) -> dict:
    """The arguments with alternative number `pick` (or the last) of each one_of chosen."""
    def value(v):
        if isinstance(v, dict) and set(v) == {"one_of"}:
            return v["one_of"][min(pick, len(v["one_of"]) - 1)]
        return v
    return {k: value(v) for k, v in arguments.items()}


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def test_the_task_set_is_well_formed():
    assert len(TASKS) >= 30 and len(BY_ID) == len(TASKS)
    two_calls = [t for t in TASKS if len(t.expected) == 2]
    assert len(two_calls) > len(TASKS) * 3 // 4  # mostly 2-call agent loops
    for task in TASKS:
        tools = [parse_tool(t) for t in task.tools]  # each a valid OpenAI function schema
        assert 2 <= len(tools) <= 5, task.id
        shape = {"single": [1], "parallel": [2], "dependent": [1, 1]}[task.kind]
        assert [len(step) for step in task.steps] == shape, task.id
        for call in task.expected:
            widest = max([len(v["one_of"]) for v in call.arguments.values() if isinstance(v, dict)] or [1])
            for pick in range(widest):  # every alternative fits the schema
                errors = argument_errors(Call(call.name, _concrete(call.arguments, pick)), tools)
                assert not errors, (task.id, errors)
        results = _norm(" ".join(c.result_text() for c in task.expected))
        for fact in task.facts:
            assert any(_norm(f) in results for f in fact), (task.id, fact)  # the results hold the fact...
            assert not any(_norm(f) in _norm(task.request) for f in fact), (task.id, fact)  # ...the request does not
        if task.kind == "dependent":  # the second call needs a value the request does not give
            values = [str(v) for v in _concrete(task.steps[1][0].arguments, 0).values()]
            assert any(_norm(v) not in _norm(task.request) for v in values), task.id


def test_the_task_set_mixes_result_forms_and_argument_types():
    results = [c.result for t in TASKS for c in t.expected]
    assert sum(isinstance(r, str) for r in results) >= 10 and sum(not isinstance(r, str) for r in results) >= 10
    types = {p.get("type") for t in TASKS for tool in t.tools for p in tool["function"]["parameters"]["properties"].values()}
    assert {"string", "number", "integer", "boolean"} <= types
    assert any("enum" in p for t in TASKS for tool in t.tools for p in tool["function"]["parameters"]["properties"].values())


# --- the command ------------------------------------------------------------------------------

def test_an_unreachable_server_is_one_line_and_status_2(capsys, tmp_path: Path):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "agent", "--url", url, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach a server at {url}") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_bench_agent_runs_the_loop_against_a_real_server(capsys, tmp_path: Path):
    """Protocol, not correctness: the tiny random cascade always calls (nonsense), so each task
    goes round the loop; the server must accept the tool messages and the report record it all."""
    key = "agent-key"
    out = tmp_path / "out"
    with running_server({"method": "cascade", "api_key": key}) as url:
        assert main(["bench", "agent", "--url", url, "--model", "nope", "--api-key", key, "--out", str(out)]) == 2
        assert "not 'nope': use --model" in capsys.readouterr().err
        assert main(["bench", "agent", "--url", url, "--api-key", key, "--tasks", "2", "--label", "tiny",
                     "--out", str(out)]) == 0
    text = (out / "agent.json").read_text()
    assert key not in text  # the key is masked in the recorded command
    report = json.loads(text)
    assert [t["id"] for t in report["tasks"]] == [t.id for t in TASKS[:2]]
    assert report["git"]["commit"] and report["machine"]["cores"] >= 1
    (server,) = report["servers"]
    assert server["label"] == "tiny" and server["summary"]["n"] == 2 and server["summary"]["total_vs_first"] in (1.0, None)
    for result in server["results"]:
        # the first reply had calls, so the tool results went back at least once, and no request failed
        assert 2 <= result["requests"] <= MAX_REQUESTS and len(result["latencies"]) == result["requests"]
        assert len(result["server_timings"]) == result["requests"] and all(result["server_timings"])
        assert result["calls"] and all(c["request"] >= 1 for c in result["calls"])
        assert not (result["reason"] or "").startswith("request"), result["reason"]
        assert result["correct"] is (result["reason"] is None)
    md = (out / "agent.md").read_text()
    assert "| tiny |" in md and TASKS[0].id in md
    assert (out / "agent.png").stat().st_size > 0
