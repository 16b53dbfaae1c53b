"""The traffic store's contract, run on SQLite and on a real PostgreSQL server alike."""
from __future__ import annotations

import time

import pytest

from hyfunc.routing.record import ServedRequest
from hyfunc.routing.store import (
    Label,
    Query,
    StoreError,
    StoreUnavailable,
    UnknownRequest,
    encode,
    library_fingerprint,
)
from hyfunc.routing.stores import open_store
from tests.pg_server import free_port

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}


def served(i: int, tools: list[dict], path: str = "cascade", **kw) -> ServedRequest:
    return ServedRequest(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"weather in Paris? #{i}"}],
        tools=tools, calls=[{"name": "get_weather", "arguments": {"city": "Paris", "n": i, "tags": ["a", "é"]}}],
        path=path, models={"large": "qwen-coder-1.5b@abc", "small": "qwen-coder-0.5b@def"},
        timings={"large": 0.5, "small": 0.25}, input_tokens=100 + i, output_tokens=7, injected_tokens=3,
        request_id=f"req-{i}", created=1_700_000_000.0 + i, **kw,
    )


def test_round_trip_and_one_copy_of_each_library(store_url: str) -> None:
    # The same library sent with another key order is the same library: stored once.
    reordered = {"function": dict(reversed(list(WEATHER["function"].items()))), "type": "function"}
    requests = [served(0, [WEATHER]), served(1, [reordered]), served(2, [WEATHER, TIME], path="small",
                                                                          text="", error="parse error")]
    with open_store(store_url) as store:
        store.write([encode(r) for r in requests])
        back = list(store.iter_requests())
        assert [b.request.request_id for b in back] == ["req-0", "req-1", "req-2"]
        for original, got in zip(requests, back):
            assert got.request.messages == original.messages
            assert got.request.calls == original.calls
            assert got.request.models == original.models and got.request.timings == original.timings
            assert (got.request.input_tokens, got.request.output_tokens, got.request.injected_tokens) == (
                original.input_tokens, original.output_tokens, original.injected_tokens)
            assert got.request.created == original.created and got.request.error == original.error
            assert got.library == library_fingerprint(original.tools)
        assert back[0].library == back[1].library != back[2].library
        assert store.tools(back[2].library) == [WEATHER, TIME]
        stats = store.stats()
        assert stats.total == 3 and stats.errors == 1 and stats.by_path == {"cascade": 2, "small": 1}
        assert sorted(l["requests"] for l in stats.by_library) == [1, 2]
        assert sorted(l["n_tools"] for l in stats.by_library) == [1, 2]


def test_text_answer_and_nul_character(store_url: str) -> None:
    r = served(0, [WEATHER])
    r.calls, r.text = [], "No tool fits \x00 this."
    with open_store(store_url) as store:
        store.write([encode(r)])
        got = store.get("req-0").request
        assert got.calls == [] and got.text == "No tool fits \ufffd this."


def test_rewriting_an_id_keeps_the_first_copy(store_url: str) -> None:
    first, second = served(0, [WEATHER]), served(0, [WEATHER])
    second.text = "second"
    with open_store(store_url) as store:
        store.write([encode(first)])
        store.write([encode(second)])
        assert [b.request.text for b in store.iter_requests()] == [""]


def test_queries_by_time_path_and_library_across_pages(store_url: str) -> None:
    # 1,100 rows: more than two read pages, so the keyset pagination is exercised.
    requests = [served(i, [WEATHER] if i % 2 else [TIME], path="small" if i % 3 == 0 else "cascade")
                for i in range(1100)]
    with open_store(store_url) as store:
        store.write([encode(r) for r in requests])
        assert [s.request.request_id for s in store.iter_requests()] == [r.request_id for r in requests]
        window = list(store.iter_requests(Query(since=1_700_000_010.0, until=1_700_000_020.0)))
        assert [s.request.request_id for s in window] == [f"req-{i}" for i in range(10, 20)]
        small = list(store.iter_requests(Query(paths=("small",))))
        assert len(small) == len([i for i in range(1100) if i % 3 == 0])
        assert all(s.request.path == "small" for s in small)
        weather = library_fingerprint([WEATHER])
        odd = list(store.iter_requests(Query(library=weather, limit=520)))
        assert [s.request.request_id for s in odd] == [f"req-{i}" for i in range(1, 1040, 2)]
        assert list(store.iter_requests(Query(paths=()))) == []


def test_feedback(store_url: str) -> None:
    with open_store(store_url) as store:
        store.write([encode(served(i, [WEATHER])) for i in range(3)])
        store.set_feedback("req-1", "bad", at=5.0)
        store.set_feedback("req-1", "good", at=6.0)  # a later verdict replaces the earlier one
        store.set_feedback("req-2", "bad", at=7.0)
        got = store.get("req-1")
        assert (got.feedback, got.feedback_at) == ("good", 6.0)
        assert store.stats().feedback == {"good": 1, "bad": 1, "none": 1}
        with pytest.raises(UnknownRequest, match="req-404"):
            store.set_feedback("req-404", "good", at=1.0)
        with pytest.raises(StoreError, match="good, bad"):
            store.set_feedback("req-1", "meh", at=1.0)
        with pytest.raises(UnknownRequest):
            store.get("req-404")


def test_labels_round_trip_and_unlabelled_filter(store_url: str) -> None:
    with open_store(store_url) as store:
        store.write([encode(served(i, [WEATHER])) for i in range(4)])
        labels = [Label(f"req-{i}", simple=i % 2 == 0, small_calls=[{"name": "get_weather", "arguments": {}}],
                        features={"request_chars": 10.0 + i}, embedding=[0.5, -1.25, float(i)],
                        embedder="minilm", small_path="rule") for i in (0, 1)]
        store.save_labels(labels)
        store.save_labels([Label("req-1", True, [], {"request_chars": 1.0}, None, "minilm", "rule")])  # relabel
        got = {s.request.request_id: l for s, l in store.iter_labels()}
        assert set(got) == {"req-0", "req-1"}
        assert got["req-0"].embedding == [0.5, -1.25, 0.0] and got["req-0"].simple
        assert got["req-1"].simple and got["req-1"].embedding is None and got["req-1"].features == {"request_chars": 1.0}
        left = [s.request.request_id for s in store.iter_requests(Query(unlabelled_only=True))]
        assert left == ["req-2", "req-3"]
        stats = store.stats()
        assert (stats.labelled, stats.simple) == (2, 2)


def test_migrations_are_versioned_and_keep_data(store_url: str) -> None:
    with open_store(store_url, schema_target=1) as old:
        assert old.schema_version() == 1
        old.write([encode(served(0, [WEATHER]))])
    with open_store(store_url) as new:  # a newer hyfunc opens the old store: migrates, keeps rows
        assert new.schema_version() == new.migrations[-1][0] >= 2
        assert [s.request.request_id for s in new.iter_requests()] == ["req-0"]
        new.save_labels([Label("req-0", True, [], {}, None, "", "")])
    with open_store(store_url) as again:  # reopening is a no-op
        assert again.schema_version() == again.migrations[-1][0] and again.stats().labelled == 1
    # A store written by a *newer* hyfunc is refused rather than misread.
    with open_store(store_url) as store:
        with store._transaction(write=True) as cur:
            P = store.placeholder
            cur.execute(f"INSERT INTO schema_version (version, description, applied) VALUES ({P}, {P}, {P})",
                        (99, "future", time.time()))
    with pytest.raises(StoreError, match="schema version 99, newer"):
        open_store(store_url)


def test_bad_urls_and_unreachable_database(tmp_path) -> None:
    with pytest.raises(StoreError, match="unsupported store URL"):
        open_store("mysql://localhost/db")
    with pytest.raises(StoreError, match="names no file"):
        open_store("sqlite:///")
    with pytest.raises(StoreError, match="bad PostgreSQL URL"):
        open_store("postgresql://host/db?nonsense_option=1")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="unreachable|refused|connect"):
        open_store(f"postgresql://u:secret@127.0.0.1:{free_port()}/db", timeout=1.0)
    assert time.monotonic() - started < 10
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot open"):
        open_store(blocker / "traffic.sqlite")


def test_password_is_not_in_messages() -> None:
    with pytest.raises(StoreUnavailable) as info:
        open_store(f"postgresql://user:hunter2@127.0.0.1:{free_port()}/db", timeout=1.0)
    assert "hunter2" not in str(info.value) and "***" in str(info.value)
