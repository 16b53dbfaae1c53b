"""Router versions shared by replicas: the PostgreSQL registry (real server), promotion and rollback
raced by two processes (PostgreSQL and a directory), and two `hyfunc serve` replicas (real uvicorn
processes) picking up a promotion and a rollback made elsewhere; a replica killed while both log to one
PostgreSQL traffic store."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from hyfunc.cli import main
from hyfunc.routing.registry import PostgresVersions, is_registry_url, open_versions
from hyfunc.routing.stores import open_store
from hyfunc.routing.versions import Metrics, Versions, VersionError
from tests.odia_fixtures import LONG, SHORT, save_tiny_model, tiny_version
from tests.pg_server import Cluster, wait_until
from tests.serve_app import SMALL_HIDDEN
from tests.serve_process import ROOT, running_server, server_process
from tests.test_serve_sdk import ASK, TOOLS

METRICS = Metrics(agreement=1.0, share=0.5, mean_latency=0.1)


def _files(directory: Path, text: str) -> None:
    (directory / "router").mkdir()
    (directory / "router" / "router.json").write_text(json.dumps({"text": text}))
    (directory / "shared.bin").write_bytes(b"\x00\x01same in every version")


def test_versions_round_trip_through_postgresql(postgres_cluster: Cluster, tmp_path: Path) -> None:
    url = postgres_cluster.create_database("registry_round_trip")
    assert is_registry_url(url) and not is_registry_url(tmp_path)
    writer = open_versions(url, cache_dir=tmp_path / "writer")
    reader = PostgresVersions(url, cache_dir=tmp_path / "reader")  # another replica: nothing cached
    try:
        assert reader.champion is None and reader.list() == []
        v1 = writer.create(lambda d: _files(d, "one"), metrics=METRICS, parents=[])
        v2 = writer.create(lambda d: _files(d, "two"), metrics=METRICS, parents=[v1], note="second")
        assert [m["id"] for m in reader.list()] == [v1, v2] and reader.manifest(v2)["parents"] == [v1]
        assert reader.metrics(v2) == METRICS
        copied = reader.path(v2)
        assert copied.parent == tmp_path / "reader"
        assert json.loads((copied / "router" / "router.json").read_text()) == {"text": "two"}
        assert json.loads((copied / "manifest.json").read_text())["note"] == "second"
        with writer.store.transaction() as cur:  # the shared file is stored once
            cur.execute("SELECT count(*) FROM version_files")
            assert cur.fetchone()[0] == 5  # 2 manifests, 2 router.json, 1 shared.bin

        reader.promote(v1)
        reader.promote(v2)
        assert (writer.champion, writer.previous) == (v2, v1)
        assert writer.rollback() == v1 and reader.aliases() == {"champion": v1, "history": []}
        with pytest.raises(VersionError, match="nothing to roll back"):
            reader.rollback()
        with pytest.raises(VersionError, match="no version"):
            reader.promote("missing")
        assert reader.champion == v1

        # A corrupt file is refused, and nothing half-copied is left behind.
        with writer.store.transaction() as cur:
            cur.execute("UPDATE version_files SET data = %s WHERE data = %s",
                        (b"tampered", json.dumps({"text": "one"}).encode()))
        fresh = PostgresVersions(url, cache_dir=tmp_path / "fresh")
        with pytest.raises(VersionError, match="corrupt"):
            fresh.path(v1)
        assert not (tmp_path / "fresh" / v1).exists()
        fresh.close()
    finally:
        writer.close()
        reader.close()


RACER = """
import json, sys
from hyfunc.routing.registry import open_versions
from hyfunc.routing.versions import VersionError
location, cache, mine = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kwargs = {"cache_dir": __import__("pathlib").Path(cache)} if location.startswith("postgresql") else {}
versions = open_versions(location, **kwargs)
versions.aliases()  # connected: then wait for the other racer, so that both run at once
print("ready", flush=True)
sys.stdin.readline()
promoted = rolled_back = 0
for i, vid in enumerate(mine):
    versions.promote(vid)
    promoted += 1
    if i % 2:
        try:
            versions.rollback()
            rolled_back += 1
        except VersionError:
            pass
print(json.dumps({"promoted": promoted, "rolled_back": rolled_back}))
"""


@pytest.mark.parametrize("kind", ["directory", "postgresql"])
def test_two_processes_racing_promote_and_rollback_lose_no_update(kind: str, request: pytest.FixtureRequest,
                                                                   tmp_path: Path) -> None:
    if kind == "postgresql":
        location = request.getfixturevalue("postgres_cluster").create_database("registry_race")
        versions = open_versions(location, cache_dir=tmp_path / "cache")
    else:
        location = str(tmp_path / "odia")
        versions = Versions(location)
    per_racer = 100
    made = [versions.create(lambda d: _files(d, "x"), metrics=METRICS, parents=[]) for _ in range(1 + 2 * per_racer)]
    versions.promote(made[0])
    halves = [made[1:per_racer + 1], made[per_racer + 1:]]
    racers = [subprocess.Popen([sys.executable, "-c", RACER, location, str(tmp_path / f"cache{k}"), json.dumps(half)],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for k, half in enumerate(halves)]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
    outcomes = []
    for racer in racers:
        racer.stdin.write("go\n")
        racer.stdin.flush()
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err
        outcomes.append(json.loads(out))
    # Every promotion pushes one entry and every successful rollback pops one: a lost update
    # (two read-change-writes interleaved) breaks the count.
    aliases = versions.aliases()
    entries = 1 + len(aliases["history"])
    assert entries == 1 + sum(o["promoted"] for o in outcomes) - sum(o["rolled_back"] for o in outcomes)
    assert all(o["promoted"] == per_racer for o in outcomes)
    if kind == "postgresql":
        versions.close()


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("small") / "model", SMALL_HIDDEN, 2)


def test_two_replicas_pick_up_a_promotion_and_a_rollback_made_elsewhere(
    postgres_cluster: Cluster, small_model: Path, tmp_path: Path
) -> None:
    url = postgres_cluster.create_database("registry_replicas")
    versions = PostgresVersions(url, cache_dir=tmp_path / "cycle")
    v1 = versions.create(lambda d: tiny_version(d, small_model), metrics=METRICS, parents=[])  # short -> small
    v2 = versions.create(lambda d: tiny_version(d, small_model, threshold=1.01), metrics=METRICS, parents=[v1])
    versions.promote(v1)
    settings = {"router": url, "poll": 0.2}
    with running_server(settings, command=_command()) as first, running_server(settings, command=_command()) as second:
        replicas = [openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
                    for base in (first, second)]

        def paths(text: str) -> list[str]:
            return [client.chat.completions.with_raw_response.create(
                model="hyfunc", messages=[{"role": "user", "content": text}], tools=TOOLS).headers["x-hyfunc-path"]
                for client in replicas]

        assert paths(SHORT) == ["small", "small"] and paths(LONG) == ["cascade", "cascade"]
        versions.promote(v2)  # as a cycle run on another machine would
        assert wait_until(lambda: paths(SHORT) == ["cascade", "cascade"], 5, interval=0.2)
        assert main(["odia", "rollback", "--dir", url]) == 0
        assert wait_until(lambda: paths(SHORT) == ["small", "small"], 5, interval=0.2)
    versions.close()


def test_killing_one_replica_loses_no_request_the_other_replica_answered(postgres_cluster: Cluster) -> None:
    """Both replicas log to one PostgreSQL traffic store; one is killed (SIGKILL: no shutdown, its
    connection dropped mid-session) while both serve. The other goes on serving, and every request it
    answered is in the store once it stops."""
    url = postgres_cluster.create_database("replica_kill")
    settings = {"traffic": url}
    answered: dict[str, list[str]] = {"killed": [], "survivor": []}
    failures: list[str] = []
    stop = threading.Event()
    with server_process(settings, command=_command()) as (killed, victim), running_server(settings, command=_command()) as survivor:
        def drive(name: str, base: str) -> None:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
            while not stop.is_set():
                try:
                    raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=ASK, tools=TOOLS)
                    answered[name].append(raw.headers["x-request-id"])
                except openai.APIError as err:
                    if name == "survivor":
                        failures.append(repr(err))
                    return

        threads = [threading.Thread(target=drive, args=item) for item in (("killed", killed), ("survivor", survivor))]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: len(answered["killed"]) >= 3 and len(answered["survivor"]) >= 3, 60)
        victim.kill()
        victim.wait()
        before = len(answered["survivor"])
        assert wait_until(lambda: len(answered["survivor"]) >= before + 5, 60)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []
    with open_store(url) as store:
        logged = {stored.request.request_id for stored in store.iter_requests()}
    assert set(answered["survivor"]) <= logged
    assert len(answered["survivor"]) >= before + 5


def _command() -> list[str]:
    return [sys.executable, "-m", "uvicorn", "--factory", "tests.odia_app:create", "--host", "127.0.0.1",
            "--port", "{port}", "--log-level", "warning"]


def test_status_reads_the_registry(postgres_cluster: Cluster, tmp_path: Path, capsys: Any) -> None:
    url = postgres_cluster.create_database("registry_status")
    versions = PostgresVersions(url, cache_dir=tmp_path)
    vid = versions.create(lambda d: _files(d, "x"), metrics=METRICS, parents=[])
    versions.promote(vid)
    versions.close()
    assert main(["odia", "status", "--dir", url]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if vid in line)
    assert "champion" in line
