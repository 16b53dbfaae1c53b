"""Shared fixtures: a real PostgreSQL server for the traffic-store tests (see pg_server.py)."""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.pg_server import Cluster, PostgresMissing, remove_cluster, start_cluster

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One throw-away cluster per test session, started only if a test asks for it. Missing
    binaries fail the test (CI installs them), unless HYFUNC_SKIP_POSTGRES=1 says to skip."""
    try:
        cluster = start_cluster()
    except PostgresMissing as e:
        if os.environ.get("HYFUNC_SKIP_POSTGRES") == "1":
            pytest.skip(str(e))
        raise
    try:
        yield cluster
    finally:
        remove_cluster(cluster)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store location of each backend: the same tests run on both."""
    if request.param == "sqlite":
        return str(tmp_path / "traffic.sqlite")
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    return cluster.create_database(f"traffic_{os.getpid()}_{next(_databases)}")
