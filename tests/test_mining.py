"""Mining labels a toy log exactly as `same_calls` dictates; SQLite and PostgreSQL."""
from __future__ import annotations

import pytest

from hyfunc.routing.mining import SmallOutput, mine
from hyfunc.routing.record import ServedRequest
from hyfunc.routing.store import Query, encode
from hyfunc.routing.stores import open_store

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in ("f", "g")]

# request text -> (large path's calls, path, error, small path's calls or an exception)
TOY = {
    "q0": ([{"name": "f", "arguments": {"a": 1, "b": "x"}}], "cascade", None,
           [{"name": "f", "arguments": {"b": "x", "a": 1}}]),  # same call, other key order: simple
    "q1": ([{"name": "f", "arguments": {"a": 1}}], "large", None,
           [{"name": "f", "arguments": {"a": 2}}]),  # another value: not simple
    "q2": ([], "cascade", None, []),  # both refuse: simple
    "q3": ([{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}], "direct", None,
           [{"name": "g", "arguments": {}}, {"name": "f", "arguments": {"a": 1}}]),  # same calls, any order
    "q4": ([{"name": "f", "arguments": {}}], "cascade", "parse error", []),  # large path failed: skipped
    "q5": ([{"name": "f", "arguments": {}}], "small", None, []),  # answered by the small path: skipped
    "q6": ([{"name": "f", "arguments": {"a": 1}}], "cascade", None, RuntimeError("out of memory")),
    "q7": ([{"name": "f", "arguments": {"a": 1}}], "cascade", None, []),  # small refuses: not simple
}


def small_path(messages: list[dict], tools: list[dict]) -> SmallOutput:
    assert tools == TOOLS  # the small path reads the logged tools, as served
    out = TOY[messages[-1]["content"]][3]
    if isinstance(out, Exception):
        raise out
    return SmallOutput(out, confidence=0.5)


@pytest.fixture()
def toy_store(store_url: str):
    with open_store(store_url) as store:
        store.write([encode(ServedRequest([{"role": "user", "content": q}], TOOLS, calls, path=path, error=err,
                                          text="no tool fits" if not calls else "", request_id=q,
                                          created=1000.0 + i))
                     for i, (q, (calls, path, err, _)) in enumerate(TOY.items())])
        yield store


def test_labels_follow_same_calls(toy_store) -> None:
    report = mine(toy_store, small_path, small_path_name="toy@1", batch_size=3)
    assert (report.examined, report.labelled, report.simple, report.small_failures) == (6, 6, 3, 1)
    assert "q6: RuntimeError: out of memory" in report.failures[0]
    labels = {stored.request.request_id: label for stored, label in toy_store.iter_labels()}
    assert {k: v.simple for k, v in labels.items()} == {
        "q0": True, "q1": False, "q2": True, "q3": True, "q6": False, "q7": False}
    q0 = labels["q0"]
    assert q0.small_path == "toy@1" and q0.small_calls == [{"name": "f", "arguments": {"b": "x", "a": 1}}]
    assert q0.features["small_confidence"] == 0.5 and q0.features["large_calls"] == 1.0
    assert q0.features["tools_log"] > 0 and q0.features["small_refused"] == 0.0
    assert labels["q6"].features["small_error"] == 1.0
    assert q0.embedding is None  # no embedder given


def test_mining_resumes_and_relabels(toy_store) -> None:
    first = mine(toy_store, small_path, small_path_name="toy@1", query=Query(until=1002.0))
    assert first.labelled == 2  # q0, q1 in the window
    rest = mine(toy_store, small_path, small_path_name="toy@1")
    assert rest.labelled == 4  # only what was not labelled yet
    assert mine(toy_store, small_path, small_path_name="toy@1").labelled == 0

    def better(messages: list[dict], tools: list[dict]) -> SmallOutput:
        text = messages[-1]["content"]
        return SmallOutput(TOY[text][0])  # a new small model that now agrees everywhere

    again = mine(toy_store, better, small_path_name="toy@2", relabel=True)
    assert (again.labelled, again.simple) == (6, 6)
    assert {l.small_path for _, l in toy_store.iter_labels()} == {"toy@2"}
