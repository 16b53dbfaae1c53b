"""The buffered traffic log: never blocks nor raises into the caller, loses nothing it can avoid,
and survives concurrent writers, killed writers and a database outage. SQLite and PostgreSQL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from hyfunc.routing.record import ServedRequest
from hyfunc.routing.stores import open_store
from hyfunc.routing.traffic import TrafficLog
from tests.pg_server import free_port, remove_cluster, start_cluster, wait_until
from tests.traffic_writer import TOOLS, request

ROOT = Path(__file__).resolve().parents[1]


def _spawn(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, "-m", "tests.traffic_writer", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_log_writes_everything_and_reports_health(store_url: str) -> None:
    log = TrafficLog(store_url, batch_size=32, flush_interval=0.01)
    started = time.perf_counter()
    for i in range(300):
        log.record(request("a", i))
    # record() only enqueues: 300 calls must take far less than one database round trip each.
    assert time.perf_counter() - started < 0.5
    assert log.flush(timeout=30)
    health = log.close()
    assert (health.accepted, health.written, health.pending, health.dropped) == (300, 300, 0, 0) and health.ok
    log.record(request("a", 999))  # after close: counted, not raised
    assert log.health().dropped == 1
    with open_store(store_url) as store:
        assert [s.request.request_id for s in store.iter_requests()] == [f"a-{i}" for i in range(300)]


def test_unstorable_record_is_rejected_alone(store_url: str) -> None:
    bad = request("b", 1)
    bad.calls = [{"name": "get_weather", "arguments": {"city": {"a", "set"}}}]  # not JSON
    with TrafficLog(store_url, flush_interval=0.01) as log:
        for r in (request("b", 0), bad, request("b", 2)):
            log.record(r)
        assert log.flush(timeout=30)
        health = log.health()
    assert (health.written, health.rejected) == (2, 1) and "b-1" in (health.last_error or "")
    with open_store(store_url) as store:
        assert [s.request.request_id for s in store.iter_requests()] == ["b-0", "b-2"]


def test_concurrent_writer_processes(store_url: str) -> None:
    open_store(store_url).close()  # not required (each writer migrates), but keeps the race on writes
    writers = [_spawn(store_url, "log", "150", f"w{k}") for k in range(3)]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"written": 150, "dropped": 0, "lost": 0}
    with open_store(store_url) as store:
        ids = [s.request.request_id for s in store.iter_requests()]
    assert sorted(ids) == sorted(f"w{k}-{i}" for k in range(3) for i in range(150))


def test_concurrent_first_open_migrates_once(store_url: str) -> None:
    # Several servers starting together on an empty store: one migrates, the others wait and see it.
    writers = [_spawn(store_url, "log", "5", f"m{k}") for k in range(3)]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    with open_store(store_url) as store:
        assert store.schema_version() == store.migrations[-1][0] and store.stats().total == 15


def test_killed_writer_loses_nothing_committed(store_url: str) -> None:
    writer = _spawn(store_url, "batches", "0", "k")
    acknowledged = 0
    assert writer.stdout is not None
    while acknowledged < 200:
        line = writer.stdout.readline()
        assert line, writer.stderr.read() if writer.stderr else "writer died"
        acknowledged = int(line)
    writer.send_signal(signal.SIGKILL)  # mid-stream: likely inside a transaction
    writer.wait(timeout=30)
    with open_store(store_url) as store:
        if hasattr(store, "integrity_check"):
            assert store.integrity_check() == "ok"
        ids = {s.request.request_id for s in store.iter_requests()}
        assert {f"k-{i}" for i in range(acknowledged)} <= ids
        assert len(ids) % 20 == 0  # batches are atomic: no half-written batch
        # ...and the store still takes writes after the crash.
        with TrafficLog(store, flush_interval=0.01) as log:
            log.record(request("after", 0))
        assert store.get("after-0").request.calls == request("after", 0).calls


def test_full_queue_drops_and_counts_instead_of_blocking() -> None:
    log = TrafficLog(f"postgresql://postgres@127.0.0.1:{free_port()}/none", max_queue=5,
                     batch_size=2, retry_max_delay=0.2, store_timeout=1.0)
    started = time.perf_counter()
    for i in range(50):
        log.record(request("q", i))
    assert time.perf_counter() - started < 0.5
    assert wait_until(lambda: log.health().write_errors > 0, timeout=30)
    health = log.close(timeout=0.5)
    # Whatever was accepted was lost at close (the store never came up); the rest was dropped.
    assert health.dropped + health.lost == 50 and health.dropped >= 43 and health.written == 0
    assert not health.ok and "unreachable" in (health.last_error or "")


def test_sqlite_outage_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store's directory should be")
    log = TrafficLog(blocker / "traffic.sqlite", retry_max_delay=0.1)
    for i in range(10):
        log.record(request("s", i))
    assert wait_until(lambda: log.health().write_errors >= 2, timeout=30)  # retried
    health = log.close(timeout=0.3)
    assert (health.lost, health.written) == (10, 0) and "cannot open" in (health.last_error or "")


def test_postgres_outage_then_recovery_loses_nothing() -> None:
    port = free_port()
    log = TrafficLog(f"postgresql://postgres@127.0.0.1:{port}/postgres", retry_max_delay=0.5, store_timeout=1.0)
    for i in range(40):
        log.record(request("o", i))
    assert wait_until(lambda: log.health().write_errors > 0, timeout=30)
    assert log.health().written == 0
    cluster = start_cluster(port)  # the database comes (back) up on the same address
    try:
        assert log.flush(timeout=60), log.health()
        health = log.close()
        assert (health.written, health.dropped, health.lost) == (40, 0, 0)
        with open_store(cluster.url) as store:
            assert store.stats().total == 40
    finally:
        remove_cluster(cluster)


def test_served_request_with_call_objects_is_accepted(tmp_path: Path) -> None:
    # The contract says dicts; a caller passing hyfunc's Call objects must not lose the record.
    from hyfunc.formats.calls import Call

    r = ServedRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                      calls=[Call("get_weather", {"city": "Oslo"})], request_id="c-0")
    with TrafficLog(tmp_path / "t.sqlite", flush_interval=0.01) as log:
        log.record(r)
        assert log.flush(timeout=30)
        assert log.store.get("c-0").request.calls == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
