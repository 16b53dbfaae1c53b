"""The shared traffic store: PostgreSQL through a connection URL (psycopg 3 + a connection pool).

Several servers log into one database; mining and the CLI read it from anywhere. The pool is
opened without waiting, so a server whose database is down still starts: its writes fail with
StoreUnavailable (counted by the traffic log) until the database is back, and the pool
reconnects on its own.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator

from hyfunc.routing.sql_store import Migration, SQLStore
from hyfunc.routing.store import StoreError, StoreUnavailable

MIGRATIONS: tuple[Migration, ...] = (
    (1, "requests and tool libraries", (
        "CREATE TABLE libraries (fingerprint TEXT PRIMARY KEY, tools TEXT NOT NULL, "
        "n_tools INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE requests (request_id TEXT PRIMARY KEY, created DOUBLE PRECISION NOT NULL, "
        "library TEXT NOT NULL REFERENCES libraries(fingerprint), messages TEXT NOT NULL, "
        "calls TEXT NOT NULL, text TEXT NOT NULL, path TEXT NOT NULL, models TEXT NOT NULL, "
        "timings TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
        "injected_tokens INTEGER NOT NULL, error TEXT, feedback TEXT, feedback_at DOUBLE PRECISION)",
        "CREATE INDEX requests_created ON requests (created, request_id)",
        "CREATE INDEX requests_path ON requests (path, created)",
        "CREATE INDEX requests_library ON requests (library, created)",
    )),
    (2, "mining labels and routing features", (
        "CREATE TABLE labels (request_id TEXT PRIMARY KEY REFERENCES requests(request_id), "
        "simple INTEGER NOT NULL, small_calls TEXT NOT NULL, features TEXT NOT NULL, embedding BYTEA, "
        "embedder TEXT NOT NULL, small_path TEXT NOT NULL, labelled DOUBLE PRECISION NOT NULL)",
    )),
    (3, "router versions and their aliases, shared by replicas (hyfunc.routing.registry)", (
        "CREATE TABLE version_files (sha256 TEXT PRIMARY KEY, data BYTEA NOT NULL)",
        "CREATE TABLE versions (id TEXT PRIMARY KEY, created DOUBLE PRECISION NOT NULL, manifest TEXT NOT NULL, "
        "files TEXT NOT NULL)",
        "CREATE TABLE version_aliases (name TEXT PRIMARY KEY, champion TEXT REFERENCES versions(id), "
        "history TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL)",
        "INSERT INTO version_aliases VALUES ('main', NULL, '[]', 0)",
    )),
)

# Any constants work: each only has to be the same for every hyfunc process using this database.
_MIGRATION_LOCK_KEY = 0x6879_6675_6E63  # "hyfunc"
_LIBRARIES_LOCK_KEY = _MIGRATION_LOCK_KEY + 1


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class PostgresStore(SQLStore):
    placeholder = "%s"
    migrations = MIGRATIONS
    row_lock = " FOR UPDATE"

    def __init__(self, url: str, min_size: int = 1, max_size: int = 4, timeout: float = 10.0,
                 schema_target: int | None = None, lazy: bool = False) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as e:  # an optional dependency: say which extra installs it
            raise StoreError(f"a PostgreSQL store needs {e.name or 'psycopg'}, which is not installed: "
                             "pip install 'hyfunc[postgres]'") from None
        self._psycopg = psycopg
        self.url = redact(url)
        self._timeout = timeout
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as e:
            raise StoreError(f"bad PostgreSQL URL {self.url}: {str(e).splitlines()[0]}") from None
        if not lazy:
            # One direct attempt first: an unreachable database then fails at once with the
            # driver's own reason (refused, unknown host, auth), not after the pool's retries.
            try:
                psycopg.connect(url, connect_timeout=max(1, int(timeout))).close()
            except psycopg.Error as e:
                raise StoreUnavailable(f"PostgreSQL at {self.url} is unreachable: {_reason(e)}") from None
        self._pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, timeout=timeout,
            # connect_timeout bounds one attempt; without it an unroutable host blocks for minutes.
            kwargs={"connect_timeout": max(1, int(timeout))},
            # Give up a failed reconnection quickly and try again on the next request rather than
            # back off for minutes: a log that recovers late loses records to the bounded queue.
            reconnect_timeout=timeout, name="hyfunc-traffic",
        )
        self._pool.open(wait=False)
        try:
            super().__init__(schema_target=schema_target, lazy=lazy)
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        import psycopg_pool

        psycopg = self._psycopg
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                with conn.transaction():
                    with conn.cursor() as cur:
                        yield cur
        except psycopg_pool.PoolTimeout:
            raise StoreUnavailable(f"PostgreSQL at {self.url} is unreachable "
                                   f"(no connection within {self._timeout:g} s)") from None
        except psycopg_pool.PoolClosed:
            raise StoreUnavailable(f"traffic store {self.url} is closed") from None
        except psycopg.OperationalError as e:
            raise StoreUnavailable(f"PostgreSQL at {self.url}: {_first_line(e)}") from None
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL at {self.url}: {_first_line(e)}") from None

    def _lock_for_migration(self, cursor: Any) -> None:
        # Held until the migration transaction ends; CREATE TABLE IF NOT EXISTS alone races when
        # two servers start together (both see no table, one fails on the catalog's unique index).
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))

    def _lock_libraries(self, cursor: Any, exclusive: bool) -> None:
        # A writer reusing a stored library inserts nothing into `libraries` (ON CONFLICT DO
        # NOTHING), so no row lock stops the deletion of an unused one from racing its insert.
        lock = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        cursor.execute(f"SELECT {lock}(%s)", (_LIBRARIES_LOCK_KEY,))

    def transaction(self) -> Any:
        """A cursor in one transaction on the migrated schema, for the version registry's tables."""
        self._ensure_schema()
        return self._transaction(write=True)

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers now."""
        with self._transaction(write=False) as cur:
            cur.execute("SELECT 1")

    def close(self) -> None:
        self._pool.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _reason(error: BaseException) -> str:
    # psycopg's message repeats "connection failed: connection to server at ... failed:"; keep the cause.
    line = _first_line(error)
    return line.rsplit("failed: ", 1)[-1] if "failed: " in line else line
