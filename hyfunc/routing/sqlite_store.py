"""The embedded traffic store: one SQLite file in WAL mode.

WAL lets readers (mining, `hyfunc odia stats`) run while a server writes, and several processes
may write: each write is a short `BEGIN IMMEDIATE` transaction and waiters retry for up to
`busy_timeout`. `synchronous=FULL` makes every committed batch survive a killed process and a
power cut; the writer batches requests, so the fsync is paid per batch, not per request.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hyfunc.routing.sql_store import Migration, SQLStore
from hyfunc.routing.store import StoreError, StoreUnavailable

MIGRATIONS: tuple[Migration, ...] = (
    (1, "requests and tool libraries", (
        "CREATE TABLE libraries (fingerprint TEXT PRIMARY KEY, tools TEXT NOT NULL, "
        "n_tools INTEGER NOT NULL, created REAL NOT NULL)",
        "CREATE TABLE requests (request_id TEXT PRIMARY KEY, created REAL NOT NULL, "
        "library TEXT NOT NULL REFERENCES libraries(fingerprint), messages TEXT NOT NULL, "
        "calls TEXT NOT NULL, text TEXT NOT NULL, path TEXT NOT NULL, models TEXT NOT NULL, "
        "timings TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
        "injected_tokens INTEGER NOT NULL, error TEXT, feedback TEXT, feedback_at REAL)",
        "CREATE INDEX requests_created ON requests (created, request_id)",
        "CREATE INDEX requests_path ON requests (path, created)",
        "CREATE INDEX requests_library ON requests (library, created)",
    )),
    (2, "mining labels and routing features", (
        "CREATE TABLE labels (request_id TEXT PRIMARY KEY REFERENCES requests(request_id), "
        "simple INTEGER NOT NULL, small_calls TEXT NOT NULL, features TEXT NOT NULL, embedding BLOB, "
        "embedder TEXT NOT NULL, small_path TEXT NOT NULL, labelled REAL NOT NULL)",
    )),
)


class SQLiteStore(SQLStore):
    placeholder = "?"
    migrations = MIGRATIONS

    def __init__(self, path: Path | str, timeout: float = 30.0, schema_target: int | None = None,
                 lazy: bool = False) -> None:
        self.path = Path(path).expanduser()
        self.url = str(self.path)
        self._busy_timeout = timeout  # how long a write waits for another process's lock
        self._conn: sqlite3.Connection | None = None
        # One connection per store object, shared by its threads (the writer thread and the
        # caller's); sqlite3 connections are not safe for concurrent use, hence the lock.
        self._lock = threading.RLock()
        super().__init__(schema_target=schema_target, lazy=lazy)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
                )
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode.lower() != "wal":
                    conn.close()
                    raise StoreUnavailable(f"cannot put traffic store {self.path} in WAL mode (got {mode})")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA foreign_keys=ON")
            except (sqlite3.Error, OSError) as e:
                raise StoreUnavailable(f"cannot open traffic store {self.path}: {e}") from None
            self._conn = conn
        return self._conn

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            conn = self._connection()
            try:
                # IMMEDIATE takes the write lock up front: a deferred transaction that reads and
                # then writes can fail with SQLITE_BUSY without waiting when another process wrote.
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as e:
                raise StoreUnavailable(f"traffic store {self.path}: {e}") from None
            cursor = conn.cursor()
            try:
                yield cursor
            except BaseException as e:
                _rollback(conn)
                if isinstance(e, sqlite3.OperationalError):
                    raise StoreUnavailable(f"traffic store {self.path}: {e}") from None
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"traffic store {self.path}: {e}") from None
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as e:
                    _rollback(conn)
                    raise StoreUnavailable(f"traffic store {self.path}: commit failed: {e}") from None
            finally:
                cursor.close()

    def integrity_check(self) -> str:
        """SQLite's own verdict on the file ('ok' when sound)."""
        with self._transaction(write=False) as cur:
            cur.execute("PRAGMA integrity_check")
            return str(cur.fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _rollback(conn: sqlite3.Connection) -> None:
    # After some errors (e.g. SQLITE_FULL) SQLite has already rolled back, and ROLLBACK itself
    # fails; the original error is the one worth reporting.
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass
