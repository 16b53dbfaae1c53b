"""A throw-away PostgreSQL server for the tests: a real cluster in a temporary directory.

initdb refuses to run as root (CI runs as root), so when we are root every server command runs as
the unprivileged `postgres` system user through `runuser`, and the cluster directory is handed to
that user. The server listens on a free loopback port and keeps its unix socket inside the
cluster directory, so it never collides with a system PostgreSQL or another test run.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"


class PostgresMissing(RuntimeError):
    pass


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl: PATH first, then Debian's versioned layout."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresMissing("PostgreSQL server binaries (initdb, pg_ctl) not found; "
                          "install them (Debian: apt-get install -y postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresMissing(f"running as root, and there is no '{SERVER_USER}' user to run the "
                              "test server as (Debian's postgresql package creates it)") from None
    return ["runuser", "-u", SERVER_USER, "--", *cmd]


@dataclass
class Cluster:
    root: Path
    port: int
    bindir: Path

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        data = self.root / "data"
        if os.geteuid() == 0:
            # The server user must own its directory; /tmp's parents are world-traversable.
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            _as_server_user([str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                             "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"]),
            check=True, capture_output=True, text=True,
        )

    def start(self) -> None:
        # fsync off: this cluster dies with the test session; a killed *client* (what the tests
        # kill) is unaffected by it.
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=60")
        result = subprocess.run(
            _as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-l",
                             str(self.root / "server.log"), "-o", options, "-w", "-t", "60", "start"]),
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {result.stdout}{result.stderr}\n{log[-2000:]}")

    def stop(self) -> None:
        subprocess.run(
            _as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                             "-w", "stop"]),
            capture_output=True, text=True,
        )

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)


def start_cluster(port: int | None = None) -> Cluster:
    # As root the server runs as another user, who must be able to reach the directory: /tmp is
    # world-traversable, a root-owned $TMPDIR (e.g. under /root) may not be.
    parent = "/tmp" if os.geteuid() == 0 else None
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="hyfunc-pg-", dir=parent)), port or free_port(), find_bindir())
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        shutil.rmtree(cluster.root, ignore_errors=True)
        raise
    return cluster


def remove_cluster(cluster: Cluster) -> None:
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
