"""What the traffic log keeps: retention by age and by count, forgetting requests by id (store,
command line, and the server's writer), on SQLite and on a real PostgreSQL server alike."""
from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.errors import InputError
from hyfunc.routing.record import ServedRequest
from hyfunc.routing.recording import traffic_log
from hyfunc.routing.store import Label, Retention, encode, library_fingerprint
from hyfunc.routing.stores import open_store
from hyfunc.routing.traffic import TrafficLog
from tests.pg_server import wait_until
from tests.traffic_writer import TOOLS, request

NOW = 1_800_000_000.0
DAY = 86_400.0
OTHER_TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Local time",
                                                 "parameters": {"type": "object", "properties": {}}}}]


def aged(request_id: str, days_old: float, tools: list[dict] = TOOLS, now: float = NOW) -> ServedRequest:
    served = request("x", 0)
    served.request_id, served.created, served.tools = request_id, now - days_old * DAY, tools
    return served


def ids(store) -> list[str]:
    return [s.request.request_id for s in store.iter_requests()]


def test_prune_by_days_takes_feedback_labels_and_unused_libraries(store_url: str) -> None:
    # Ten requests, one a day; the two oldest are the only ones with the other tool library.
    requests = [aged(f"d{age}", age, OTHER_TOOLS if age >= 8 else TOOLS) for age in range(10)]
    with open_store(store_url) as store:
        store.write([encode(r) for r in requests])
        store.set_feedback("d9", "bad", at=NOW)
        store.set_feedback("d1", "good", at=NOW)
        store.save_labels([Label(i, True, [], {}, None, "", "") for i in ("d9", "d6", "d2")])
        assert store.prune(Retention(days=3.5), now=NOW) == 6
        assert ids(store) == ["d3", "d2", "d1", "d0"]
        stats = store.stats()
        assert stats.feedback == {"good": 1, "none": 3} and stats.labelled == 1
        assert [lib["fingerprint"] for lib in stats.by_library] == [library_fingerprint(TOOLS)]
        assert store.prune(Retention(days=3.5), now=NOW) == 0  # idempotent


def test_prune_by_rows_keeps_the_newest_in_read_order(store_url: str) -> None:
    # Three requests per timestamp: the cut falls between equal times, ordered by id as reads are;
    # 1,200 rows is more than two deleting transactions.
    requests = [aged(f"r{i:04d}", -(i // 3)) for i in range(1200)]
    with open_store(store_url) as store:
        store.write([encode(r) for r in requests])
        everything = ids(store)
        assert store.prune(Retention(rows=100), now=NOW) == 1100
        assert ids(store) == everything[-100:] and store.stats().total == 100
        assert store.prune(Retention(rows=100)) == 0
        assert store.prune(Retention(rows=5000)) == 0


def test_prune_by_days_and_rows_keeps_what_both_keep(store_url: str) -> None:
    with open_store(store_url) as store:
        store.write([encode(aged(f"b{age}", age)) for age in range(10)])
        assert store.prune(Retention(days=5.5, rows=3), now=NOW) == 7  # rows is the tighter limit
        assert ids(store) == ["b2", "b1", "b0"]
        store.write([encode(aged(f"c{age}", age + 0.5)) for age in range(10)])
        assert store.prune(Retention(days=1.8, rows=8), now=NOW) == 9  # now days is
        assert ids(store) == ["c1", "b1", "c0", "b0"]


def test_delete_requests_by_id(store_url: str) -> None:
    with open_store(store_url) as store:
        store.write([encode(aged(f"f{i}", i, OTHER_TOOLS if i == 4 else TOOLS)) for i in range(5)])
        store.set_feedback("f4", "good", at=NOW)
        store.save_labels([Label("f4", False, [], {}, None, "", "")])
        # Unknown ids and repeats are skipped; the count is of requests actually deleted.
        assert store.delete_requests(["f4", "nope", "f2", "f4"]) == 2
        assert ids(store) == ["f3", "f1", "f0"]
        stats = store.stats()
        assert stats.feedback == {"none": 3} and stats.labelled == 0 and len(stats.by_library) == 1
        assert store.delete_requests([]) == 0 and store.delete_requests(["f2"]) == 0


def test_deleting_libraries_never_fails_a_concurrent_writer(store_url: str) -> None:
    # One library for every request: each deletion that empties the store also deletes the library,
    # as unused, while the writer is adding requests that refer to it again. Neither side may fail.
    errors: list[BaseException] = []
    with open_store(store_url) as store, TrafficLog(store, batch_size=1, flush_interval=0.001) as log:
        stop = threading.Event()

        def forget_everything() -> None:
            try:
                while not stop.is_set():
                    store.delete_requests(ids(store))
            except BaseException as e:  # noqa: BLE001 - reported by the test's thread
                errors.append(e)

        forgetter = threading.Thread(target=forget_everything)
        forgetter.start()
        try:
            for i in range(1000):
                log.record(request("w", i))
            assert log.flush(timeout=60)
        finally:
            stop.set()
            forgetter.join()
        health = log.health()
    assert not errors, errors[0]
    assert (health.written, health.rejected, health.write_errors) == (1000, 0, 0), health.last_error


@pytest.mark.parametrize("days, rows, message", [
    (0, None, "positive"), (-1, None, "positive"), (math.nan, None, "positive"), (math.inf, None, "positive"),
    (None, 0, "at least 1"), (None, -5, "at least 1"),
])
def test_nonsense_retention_is_refused(days: float | None, rows: int | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Retention(days, rows)
    assert Retention().unlimited and not Retention(days=0.5).unlimited


def test_the_server_writer_prunes_at_start_and_then_periodically(tmp_path: Path) -> None:
    # The real writer on a real SQLite file: 30 requests a year old, 5 of today.
    path, now = tmp_path / "traffic.sqlite", time.time()
    with open_store(path) as store:
        store.write([encode(aged(f"old{i}", 365 + i, now=now)) for i in range(30)])
        store.write([encode(aged(f"new{i}", 0, now=now)) for i in range(5)])
    log = TrafficLog(path, flush_interval=0.01, retention=Retention(days=7), prune_interval=0.05)
    try:
        # Nothing recorded yet: the writer thread pruned on its own, at start.
        assert wait_until(lambda: log.health().pruned == 30, timeout=30), log.health()
        # Requests logged later and already past the limit go at a later prune.
        for i in range(10):
            log.record(aged(f"late{i}", 30, now=now))
        assert log.flush(timeout=30)
        assert wait_until(lambda: log.health().pruned == 40, timeout=30), log.health()
    finally:
        health = log.close()
    assert (health.written, health.pruned, health.write_errors) == (10, 40, 0)
    with open_store(path) as store:
        assert ids(store) == [f"new{i}" for i in range(5)]


def test_serve_traffic_flags_reach_the_writer(tmp_path: Path) -> None:
    # What `hyfunc serve --traffic PATH --traffic-keep-rows 2` builds.
    path = tmp_path / "traffic.sqlite"
    with open_store(path) as store:
        store.write([encode(request("s", i)) for i in range(5)])
    log = traffic_log(str(path), Retention(rows=2))
    assert log is not None
    try:
        assert wait_until(lambda: log.health().pruned == 3, timeout=30), log.health()
    finally:
        log.close()
    with open_store(path) as store:
        assert ids(store) == ["s-3", "s-4"]


@pytest.fixture()
def logged(store_url: str) -> str:
    with open_store(store_url) as store:
        store.write([encode(request("r", i)) for i in range(5)])
        store.set_feedback("r-1", "bad", at=NOW)
    return store_url


def test_forget_command(logged: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["odia", "forget", "r-1", "r-3", "--store", logged]) == 0
    assert capsys.readouterr().out.startswith("deleted 2 requests from ")
    with open_store(logged) as store:
        assert ids(store) == ["r-0", "r-2", "r-4"] and store.stats().feedback == {"none": 3}
    # An unknown id (here: one already forgotten) is named; the known one beside it is kept.
    assert main(["odia", "forget", "r-2", "r-1", "nope", "--store", logged]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'r-1', 'nope'" in err and err.rstrip().endswith("nothing deleted")
    with open_store(logged) as store:
        assert ids(store) == ["r-0", "r-2", "r-4"]


def test_prune_command(logged: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["odia", "prune", "--keep-rows", "2", "--store", logged]) == 0
    assert capsys.readouterr().out.startswith("deleted 3 requests from ")
    assert main(["odia", "prune", "--keep-days", "36500", "--store", logged]) == 0  # a century: keeps all
    assert capsys.readouterr().out.startswith("deleted 0 requests from ")
    with open_store(logged) as store:
        assert ids(store) == ["r-3", "r-4"]
    assert main(["odia", "prune", "--keep-days", "0.5", "--store", logged]) == 0  # they are from 2023
    assert capsys.readouterr().out.startswith("deleted 2 requests from ")


@pytest.mark.parametrize("argv, message", [
    (["odia", "prune"], "--keep-days DAYS and/or --keep-rows N"),
    (["odia", "prune", "--keep-days", "0"], "positive"),
    (["odia", "prune", "--keep-days", "-3"], "positive"),
    (["odia", "prune", "--keep-rows", "0"], "at least 1"),
    (["serve", "--traffic-keep-days", "3"], "need --traffic"),
    (["serve", "--traffic", "--traffic-keep-rows", "-1"], "at least 1"),
])
def test_nonsense_flags_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    assert main([*argv, "--store", str(tmp_path / "t.sqlite")] if argv[0] == "odia" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert not (tmp_path / "t.sqlite").exists()
