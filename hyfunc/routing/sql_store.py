"""The SQL shared by the SQLite and PostgreSQL stores: migrations runner, writes, deletions (retention,
forgetting a request), paged reads.

SQLite (3.24+) and PostgreSQL accept the same statements here (`ON CONFLICT ... DO NOTHING/UPDATE`,
`excluded.`), so only the placeholder, the column types of the migrations, and the way a
connection and a transaction are obtained differ between the two backends.
"""
from __future__ import annotations

import json
import threading
import time
from abc import abstractmethod
from contextlib import AbstractContextManager
from typing import Any, Iterator, Sequence

import numpy as np

from hyfunc.routing.store import (
    REQUEST_COLUMNS,
    REQUEST_SELECT,
    EncodedRequest,
    Label,
    Query,
    Retention,
    StoredRequest,
    StoreError,
    StoreStats,
    TrafficStore,
    UnknownRequest,
    check_feedback,
    decode_row,
)

Migration = tuple[int, str, Sequence[str]]  # (version, what it does, statements)

_PAGE = 500  # rows per read transaction: long scans must not hold a snapshot (or a lock) for long
# Requests per deleting transaction: a first prune of a large log must not hold the write lock
# (SQLite's is the whole file) long enough for the servers' writers to time out. Also well under
# SQLite's limit on placeholders per statement.
_DELETE_BATCH = 500
_DAY = 86_400.0


class SQLStore(TrafficStore):
    placeholder: str  # "?" (sqlite3) or "%s" (psycopg)
    migrations: Sequence[Migration]  # ordered by version; never edit a released one, append
    # Appended to a SELECT of rows the transaction is about to delete; SQLite needs none (its
    # write transactions exclude each other) and has no such syntax.
    row_lock: str = ""

    def __init__(self, schema_target: int | None = None, lazy: bool = False) -> None:
        # schema_target: migrate up to this version only (tests of migrations); None = latest.
        self._schema_target = schema_target
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        if not lazy:
            self._ensure_schema()

    # -- backend hooks -----------------------------------------------------------------------
    @abstractmethod
    def _transaction(self, write: bool) -> AbstractContextManager[Any]:
        """A DB-API cursor inside one transaction: committed on normal exit, rolled back on error.
        Connection failures are raised as StoreUnavailable, other database errors as StoreError."""

    def _lock_for_migration(self, cursor: Any) -> None:
        """Serialise concurrent migrators (several servers starting at once); SQLite's
        BEGIN IMMEDIATE already does, PostgreSQL takes an advisory lock."""

    def _lock_libraries(self, cursor: Any, exclusive: bool) -> None:
        """Until the transaction ends: shared by writers, exclusive while unused tool libraries are
        deleted, so that a library is never deleted as unused while a writer is adding a request
        that refers to it. SQLite's BEGIN IMMEDIATE already serialises the two."""

    # -- schema ------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            known = max(v for v, _, _ in self.migrations)
            target = known if self._schema_target is None else self._schema_target
            P = self.placeholder
            with self._transaction(write=True) as cur:
                self._lock_for_migration(cur)
                cur.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version ("
                    "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied DOUBLE PRECISION NOT NULL)"
                )
                cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
                current = int(cur.fetchone()[0])
                if current > known:
                    raise StoreError(
                        f"traffic store {self.url} has schema version {current}, newer than this hyfunc "
                        f"knows ({known}); upgrade hyfunc"
                    )
                for version, description, statements in self.migrations:
                    if current < version <= target:
                        for statement in statements:
                            cur.execute(statement)
                        cur.execute(
                            f"INSERT INTO schema_version (version, description, applied) VALUES ({P}, {P}, {P})",
                            (version, description, time.time()),
                        )
            self._schema_ready = True

    def schema_version(self) -> int:
        self._ensure_schema()
        with self._transaction(write=False) as cur:
            cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            return int(cur.fetchone()[0])

    # -- writes ------------------------------------------------------------------------------
    def write(self, requests: Sequence[EncodedRequest]) -> None:
        if not requests:
            return
        self._ensure_schema()
        P = self.placeholder
        libraries: dict[str, EncodedRequest] = {}
        for r in requests:
            libraries.setdefault(r.fingerprint, r)
        with self._transaction(write=True) as cur:
            self._lock_libraries(cur, exclusive=False)
            cur.executemany(
                f"INSERT INTO libraries (fingerprint, tools, n_tools, created) VALUES ({P}, {P}, {P}, {P}) "
                "ON CONFLICT (fingerprint) DO NOTHING",
                [(r.fingerprint, r.tools_json, r.n_tools, r.created) for r in libraries.values()],
            )
            cur.executemany(
                f"INSERT INTO requests ({REQUEST_COLUMNS}) VALUES ({', '.join([P] * 13)}) "
                "ON CONFLICT (request_id) DO NOTHING",
                [r.request_row() for r in requests],
            )

    def set_feedback(self, request_id: str, feedback: str, at: float) -> None:
        check_feedback(feedback)
        self._ensure_schema()
        P = self.placeholder
        with self._transaction(write=True) as cur:
            cur.execute(
                f"UPDATE requests SET feedback = {P}, feedback_at = {P} WHERE request_id = {P}",
                (feedback, at, request_id),
            )
            if cur.rowcount == 0:
                raise UnknownRequest(f"no logged request has id {request_id!r} in {self.url}")

    def save_labels(self, labels: Sequence[Label]) -> None:
        if not labels:
            return
        self._ensure_schema()
        P = self.placeholder
        rows = [
            (
                l.request_id, int(l.simple), json.dumps(l.small_calls, ensure_ascii=False),
                json.dumps(l.features, allow_nan=False),
                None if l.embedding is None else np.asarray(l.embedding, dtype="<f4").tobytes(),
                l.embedder, l.small_path, l.labelled or time.time(),
            )
            for l in labels
        ]
        with self._transaction(write=True) as cur:
            cur.executemany(
                "INSERT INTO labels (request_id, simple, small_calls, features, embedding, embedder, "
                f"small_path, labelled) VALUES ({', '.join([P] * 8)}) ON CONFLICT (request_id) DO UPDATE SET "
                "simple = excluded.simple, small_calls = excluded.small_calls, features = excluded.features, "
                "embedding = excluded.embedding, embedder = excluded.embedder, "
                "small_path = excluded.small_path, labelled = excluded.labelled",
                rows,
            )

    # -- deletions ---------------------------------------------------------------------------
    def prune(self, retention: Retention, now: float | None = None) -> int:
        self._ensure_schema()
        deleted = 0
        if retention.days is not None:
            deleted += self._delete_before((time.time() if now is None else now) - retention.days * _DAY)
        if retention.rows is not None:
            with self._transaction(write=False) as cur:
                # The oldest request kept: the newest `rows` in the (created, request_id) order of reads.
                cur.execute("SELECT created, request_id FROM requests ORDER BY created DESC, request_id DESC "
                            f"LIMIT 1 OFFSET {int(retention.rows) - 1}")
                oldest_kept = cur.fetchone()
            if oldest_kept is not None:
                deleted += self._delete_before(float(oldest_kept[0]), oldest_kept[1])
        if deleted:
            self._delete_unused_libraries()
        return deleted

    def delete_requests(self, request_ids: Sequence[str]) -> int:
        self._ensure_schema()
        unique = list(dict.fromkeys(request_ids))
        deleted = 0
        for start in range(0, len(unique), _DELETE_BATCH):
            with self._transaction(write=True) as cur:
                deleted += self._delete_ids(cur, unique[start:start + _DELETE_BATCH])
        if deleted:
            self._delete_unused_libraries()
        return deleted

    def _delete_before(self, created: float, request_id: str | None = None) -> int:
        """Delete the requests created before `created` or, with `request_id`, before that position
        in the (created, request_id) order of reads; oldest first, one batch per transaction."""
        P = self.placeholder
        if request_id is None:
            where, params = f"created < {P}", [created]
        else:
            where, params = f"(created < {P} OR (created = {P} AND request_id < {P}))", [created, created, request_id]
        deleted = 0
        while True:
            with self._transaction(write=True) as cur:
                cur.execute(f"SELECT request_id FROM requests WHERE {where} ORDER BY created, request_id "
                            f"LIMIT {_DELETE_BATCH}", params)
                ids = [row[0] for row in cur.fetchall()]
                deleted += self._delete_ids(cur, ids)
            if len(ids) < _DELETE_BATCH:
                return deleted

    def _delete_ids(self, cur: Any, ids: list[str]) -> int:
        """Delete these requests and their labels in the caller's transaction (feedback is a
        column of the request); returns how many requests were deleted."""
        if not ids:
            return 0
        marks = ", ".join([self.placeholder] * len(ids))
        # Lock the requests first: a label saved for one of them between the two deletes would
        # make the second fail on the foreign key; locked, that save waits and then fails instead.
        # In one order, so that two servers pruning the same rows cannot deadlock.
        cur.execute(f"SELECT request_id FROM requests WHERE request_id IN ({marks}) "
                    f"ORDER BY request_id{self.row_lock}", ids)
        cur.execute(f"DELETE FROM labels WHERE request_id IN ({marks})", ids)
        cur.execute(f"DELETE FROM requests WHERE request_id IN ({marks})", ids)
        return int(cur.rowcount)

    def _delete_unused_libraries(self) -> None:
        with self._transaction(write=True) as cur:
            self._lock_libraries(cur, exclusive=True)
            cur.execute("DELETE FROM libraries WHERE NOT EXISTS "
                        "(SELECT 1 FROM requests r WHERE r.library = libraries.fingerprint)")

    # -- reads -------------------------------------------------------------------------------
    def _pages(self, select: str, query: Query) -> Iterator[tuple]:
        """Rows of `select` (whose first two columns are r.request_id, r.created, as in
        REQUEST_SELECT) matching `query`, oldest first, in keyset-paginated pages."""
        self._ensure_schema()
        P = self.placeholder
        where, params = query.where(P)
        after: tuple[float, str] | None = None
        remaining = query.limit
        while remaining is None or remaining > 0:
            page = _PAGE if remaining is None else min(_PAGE, remaining)
            clause, page_params = where, list(params)
            if after is not None:
                clause += (" AND " if clause else " WHERE ") + (
                    f"(r.created > {P} OR (r.created = {P} AND r.request_id > {P}))"
                )
                page_params += [after[0], after[0], after[1]]
            with self._transaction(write=False) as cur:
                cur.execute(f"{select}{clause} ORDER BY r.created, r.request_id LIMIT {page}", page_params)
                rows = cur.fetchall()
            yield from rows
            if len(rows) < page:
                return
            after = (rows[-1][1], rows[-1][0])
            if remaining is not None:
                remaining -= len(rows)

    def iter_requests(self, query: Query = Query()) -> Iterator[StoredRequest]:
        cache: dict[str, list[dict]] = {}
        for row in self._pages(REQUEST_SELECT, query):
            yield decode_row(row, cache)

    def iter_labels(self, query: Query = Query()) -> Iterator[tuple[StoredRequest, Label]]:
        select = REQUEST_SELECT.replace(" FROM requests r", ", l.simple, l.small_calls, l.features, "
                                        "l.embedding, l.embedder, l.small_path, l.labelled FROM requests r")
        select += " JOIN labels l ON l.request_id = r.request_id"
        cache: dict[str, list[dict]] = {}
        plain = Query(query.since, query.until, query.paths, query.library, query.without_error, False, query.limit)
        for row in self._pages(select, plain):
            stored = decode_row(row[:16], cache)
            simple, small_calls, features, embedding, embedder, small_path, labelled = row[16:]
            yield stored, Label(
                request_id=stored.request.request_id,
                simple=bool(simple),
                small_calls=json.loads(small_calls),
                features=json.loads(features),
                embedding=None if embedding is None else np.frombuffer(bytes(embedding), dtype="<f4").tolist(),
                embedder=embedder,
                small_path=small_path,
                labelled=float(labelled),
            )

    def get(self, request_id: str) -> StoredRequest:
        self._ensure_schema()
        with self._transaction(write=False) as cur:
            cur.execute(f"{REQUEST_SELECT} WHERE r.request_id = {self.placeholder}", (request_id,))
            row = cur.fetchone()
        if row is None:
            raise UnknownRequest(f"no logged request has id {request_id!r} in {self.url}")
        return decode_row(row, {})

    def tools(self, fingerprint: str) -> list[dict]:
        self._ensure_schema()
        with self._transaction(write=False) as cur:
            cur.execute(f"SELECT tools FROM libraries WHERE fingerprint = {self.placeholder}", (fingerprint,))
            row = cur.fetchone()
        if row is None:
            raise StoreError(f"no tool library with fingerprint {fingerprint} in {self.url}")
        return json.loads(row[0])

    def stats(self) -> StoreStats:
        self._ensure_schema()
        out = StoreStats()
        with self._transaction(write=False) as cur:
            cur.execute("SELECT COUNT(*), MIN(created), MAX(created), "
                        "SUM(CASE WHEN error IS NULL THEN 0 ELSE 1 END) FROM requests")
            total, first, last, errors = cur.fetchone()
            out.total, out.errors = int(total), int(errors or 0)
            out.first = None if first is None else float(first)
            out.last = None if last is None else float(last)
            cur.execute("SELECT path, COUNT(*) FROM requests GROUP BY path ORDER BY COUNT(*) DESC, path")
            out.by_path = {path: int(n) for path, n in cur.fetchall()}
            cur.execute(
                "SELECT t.fingerprint, t.n_tools, COUNT(r.request_id) FROM libraries t "
                "LEFT JOIN requests r ON r.library = t.fingerprint GROUP BY t.fingerprint, t.n_tools "
                "ORDER BY COUNT(r.request_id) DESC, t.fingerprint"
            )
            out.by_library = [{"fingerprint": f, "n_tools": int(k), "requests": int(n)} for f, k, n in cur.fetchall()]
            cur.execute("SELECT COALESCE(feedback, 'none'), COUNT(*) FROM requests GROUP BY COALESCE(feedback, 'none')")
            out.feedback = {k: int(n) for k, n in cur.fetchall()}
            cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            out.schema_version = int(cur.fetchone()[0])
            if out.schema_version >= 2:
                cur.execute("SELECT COUNT(*), COALESCE(SUM(simple), 0) FROM labels")
                labelled, simple = cur.fetchone()
                out.labelled, out.simple = int(labelled), int(simple)
        return out
