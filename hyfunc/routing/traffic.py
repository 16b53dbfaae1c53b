"""The traffic log: a non-blocking `TrafficSink` that writes served requests to a store.

`record()` only puts the request on a bounded queue (microseconds); a background thread encodes
and writes batches. The request path never waits for the database and never sees its errors:

- store down (StoreUnavailable): the batch is kept and retried with capped exponential backoff;
  meanwhile the queue absorbs new records, and once it is full new records are *dropped* and
  counted, so memory stays bounded during a long outage;
- a record the store refuses (not JSON, rejected by the database): it is isolated from its batch,
  *rejected* and counted; the rest of the batch is written;
- close(): writes what is queued; what the store cannot take before the deadline is *lost*, counted.

`health()` reports all counts and the last error, for the server's metrics and `hyfunc odia stats`.
With a `Retention`, the same thread also prunes the store: when it starts, then every
`prune_interval` seconds; a failed prune is counted as a write error and tried again next time.
A process killed outright loses only what it had not yet written (at most ~flush_interval of
traffic); everything committed before stays intact (tests/test_traffic_store.py kills writers).
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hyfunc.routing.record import ServedRequest
from hyfunc.routing.store import (
    EncodedRequest,
    Retention,
    StoreError,
    StoreUnavailable,
    TrafficStore,
    UnknownRequest,
    check_feedback,
    encode,
)
from hyfunc.routing.stores import open_store


@dataclass(frozen=True)
class LogHealth:
    accepted: int  # taken by record() onto the queue
    written: int  # committed to the store
    dropped: int  # refused by record(): queue full (store too slow or down) or log closed
    rejected: int  # cannot be stored at all (bad record); never retried
    lost: int  # still unwritten when close() gave up (store down at shutdown)
    write_errors: int  # failed write attempts (each one retried), prunes included
    pending: int  # accepted, not yet written, rejected or lost
    last_error: str | None
    pruned: int  # logged requests deleted by the retention setting

    @property
    def ok(self) -> bool:
        return self.dropped == self.rejected == self.lost == 0


class TrafficLog:
    """Implements `TrafficSink`. `store` is a TrafficStore, or a URL/path for `open_store` (None =
    the embedded SQLite file), opened lazily so that a database that is down does not stop a server
    from starting; a malformed URL still raises StoreError here, at start-up. `retention`: what of
    the store to keep (default: everything)."""

    def __init__(self, store: TrafficStore | str | Path | None = None, *, max_queue: int = 10_000,
                 batch_size: int = 256, flush_interval: float = 0.2, retry_max_delay: float = 5.0,
                 store_timeout: float = 5.0, retention: Retention | None = None,
                 prune_interval: float = 300.0) -> None:
        # store_timeout bounds one write attempt (waiting for a connection or a lock), and so how
        # long close() can overrun its own timeout while the writer is inside an attempt.
        self._store_timeout = store_timeout
        self.store = (store if isinstance(store, TrafficStore)
                      else open_store(store, lazy=True, timeout=store_timeout))
        self._owns_store = not isinstance(store, TrafficStore)
        self._queue: queue.Queue[ServedRequest] = queue.Queue(maxsize=max_queue)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._retry_max_delay = retry_max_delay
        self._retention = None if retention is None or retention.unlimited else retention
        self._prune_interval = prune_interval
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self._accepted = self._written = self._dropped = self._rejected = self._lost = self._errors = 0
        self._pruned = 0
        self._last_error: str | None = None
        self._closing = threading.Event()
        self._deadline = float("inf")  # monotonic time after which close() stops retrying
        self._thread = threading.Thread(target=self._run, name="hyfunc-traffic-log", daemon=True)
        self._thread.start()
        # A server that exits without close() would otherwise lose its last batch with the daemon thread.
        atexit.register(self._close_at_exit)

    # -- the caller's side -------------------------------------------------------------------
    def record(self, request: ServedRequest) -> None:
        if self._closing.is_set():
            with self._lock:
                self._dropped += 1
            return
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            with self._lock:
                self._dropped += 1
            return
        with self._lock:
            self._accepted += 1

    def health(self) -> LogHealth:
        with self._lock:
            done = self._written + self._rejected + self._lost
            return LogHealth(self._accepted, self._written, self._dropped, self._rejected, self._lost,
                             self._errors, self._accepted - done, self._last_error, self._pruned)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record accepted so far is written (or rejected/lost); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._progress:
            target = self._accepted
            while self._written + self._rejected + self._lost < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._progress.wait(left if left is None else min(left, 0.5))
            return True

    def feedback(self, request_id: str, verdict: str, wait: float = 2.0) -> None:
        """Record a client's verdict (good | bad) on a logged answer. A request answered moments ago
        may still sit in the queue: on an unknown id the queue is flushed (for at most `wait` s)
        and the update tried once more. Raises StoreError (bad verdict), UnknownRequest,
        StoreUnavailable: unlike record(), this is the caller's own request and must say why."""
        check_feedback(verdict)
        try:
            self.store.set_feedback(request_id, verdict, at=time.time())
        except UnknownRequest:
            if not self.flush(timeout=wait):
                raise
            self.store.set_feedback(request_id, verdict, at=time.time())

    def close(self, timeout: float = 10.0) -> LogHealth:
        """Stop accepting, write what is queued (retrying for up to `timeout` s if the store is
        down), count the rest as lost, and close a store this log opened."""
        if not self._closing.is_set():
            self._deadline = time.monotonic() + timeout
            self._closing.set()
            self._thread.join(timeout + self._store_timeout + 1.0)
            atexit.unregister(self._close_at_exit)
            if self._owns_store:
                self.store.close()
        return self.health()

    def _close_at_exit(self) -> None:
        self.close(timeout=2.0)

    def __enter__(self) -> "TrafficLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread -------------------------------------------------------------------
    def _take(self, batch: list[ServedRequest]) -> None:
        """Fill `batch` up to batch_size from the queue, waiting at most one flush interval."""
        if not batch:
            try:
                batch.append(self._queue.get(timeout=self._flush_interval))
            except queue.Empty:
                return
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _count(self, written: int = 0, rejected: int = 0, lost: int = 0, error: str | None = None) -> None:
        with self._progress:
            self._written += written
            self._rejected += rejected
            self._lost += lost
            if error is not None:
                self._errors += 1
                self._last_error = error
            self._progress.notify_all()

    def _run(self) -> None:
        batch: list[ServedRequest] = []
        delay = 0.0
        next_prune = time.monotonic()
        while True:
            if self._retention is not None and time.monotonic() >= next_prune and not self._closing.is_set():
                self._prune(self._retention)
                next_prune = time.monotonic() + self._prune_interval
            self._take(batch)
            if not batch:
                if self._closing.is_set():
                    return
                continue
            try:
                self._write(batch)
                batch, delay = [], 0.0
            except Exception as e:  # StoreUnavailable, or a bug: either way, never kill the thread
                self._count(error=str(e) if isinstance(e, StoreError) else f"{type(e).__name__}: {e}")
                if self._past_deadline():
                    self._give_up(batch)
                    return
                delay = min(self._retry_max_delay, max(0.05, delay * 2))
                end = time.monotonic() + delay
                while time.monotonic() < end and not self._past_deadline():
                    time.sleep(0.02)

    def _prune(self, retention: Retention) -> None:
        try:
            pruned = self.store.prune(retention)
        except Exception as e:  # the store is down, or a bug: writing goes on either way
            self._count(error=f"pruning: {e}" if isinstance(e, StoreError) else f"pruning: {type(e).__name__}: {e}")
        else:
            with self._lock:
                self._pruned += pruned

    def _past_deadline(self) -> bool:
        return self._closing.is_set() and time.monotonic() >= self._deadline

    def _write(self, batch: list[ServedRequest]) -> None:
        """Write the batch or raise StoreUnavailable with the batch unchanged for a retry; bad
        records are counted as rejected and removed from the batch."""
        encoded: list[EncodedRequest] = []
        for request in list(batch):
            try:
                encoded.append(encode(request))
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                batch.remove(request)
                self._count(rejected=1, error=f"request {getattr(request, 'request_id', '?')}: unstorable: {e}")
        try:
            self.store.write(encoded)
        except StoreUnavailable:
            raise
        except StoreError:
            # One bad record fails the whole transaction; write one by one to isolate it.
            for request, enc in zip(list(batch), encoded):
                try:
                    self.store.write([enc])
                except StoreUnavailable:
                    raise
                except StoreError as e:
                    self._count(rejected=1, error=str(e))
                else:
                    self._count(written=1)
                batch.remove(request)
            return
        self._count(written=len(encoded))

    def _give_up(self, batch: list[ServedRequest]) -> None:
        lost = len(batch)
        while True:
            try:
                self._queue.get_nowait()
                lost += 1
            except queue.Empty:
                break
        self._count(lost=lost)
