"""The model worker: threads that run the models, fed by a bounded queue.

The models are not thread-safe in general (a Backend's KV caches, the cascade's library state, the
direct method's prefix cache), so by default exactly one request runs at a time. With `batch` > 1,
requests submitted with the same `group` (the service gives one to cascade requests on llama.cpp
over a library already held: models/step_batcher.py merges their steps) run together, up to
`batch` at once; anything else (no group, another group, background work) runs alone, in order of
arrival: a request never overtakes an earlier one that waits for the group to finish.
Admission is decided at once in the event loop: past `max_queue` waiting requests, `submit`
raises `QueueFull` (the app answers 429 with Retry-After) instead of letting requests pile up.
A request whose client left, or whose time limit passed, before it started is dropped unrun;
once started, it stops at its next model step (`models/interrupt.py`), a text reply at its next token.

Low-priority work (a new tool library's embedding, `library_jobs.py`) goes through
`submit_background`: the same FIFO queue, so a request queued behind it waits for at most the one
step running, but neither counted as a request (no 429, no gauges) nor drained at shutdown.

`retry_after` tells a refused client when to come back: the mean time the worker spent on its
recent requests (an exponential average), i.e. about when the running one finishes and a place in
the queue frees; 1 s before any request has finished. `oldest_wait` says how long the oldest
queued request has waited: readiness (/health/ready) and a gauge read it.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Hashable

from hyfunc.models.interrupt import Interrupted, stop_when
from hyfunc.models.step_batcher import request_thread
from hyfunc.serving.metrics import ServerMetrics

#: Weight of the newest request in the average service time (about the last ten count).
SERVICE_TIME_WEIGHT = 0.2
RETRY_AFTER_MAX = 120  # seconds: past that a client does better to try elsewhere


class QueueFull(Exception):
    pass


class Cancelled(Exception):
    """The request was given up (client gone, time limit) before or while it ran."""


class Job:
    def __init__(self, deadline: float):
        self.deadline = deadline  # time.monotonic() after which the work should stop
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.started: float | None = None
        self.future: Future = Future()

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline

    def cancel(self) -> None:
        self.cancelled.set()
        self.future.cancel()  # only succeeds while it still waits in the queue


class ModelWorker:
    def __init__(self, max_queue: int, metrics: ServerMetrics | None = None, batch: int = 1):
        self.max_queue = max_queue
        self.metrics = metrics
        self.batch = max(1, batch)
        self._executor = ThreadPoolExecutor(max_workers=self.batch, thread_name_prefix="hyfunc-model")
        self._lock = threading.Lock()
        self._admission = threading.Condition(self._lock)
        self._tickets = 0  # order of submission
        self._waiting_tickets: set[int] = set()  # picked by a thread, waiting to be admitted
        self._group: Hashable | None = None  # of the jobs running together
        self._group_size = 0
        self._pending = 0  # queued + running
        self._running = 0
        self._service_seconds: float | None = None  # average time a request held the worker
        self._queued: dict[Job, None] = {}  # submitted, not started, oldest first (the executor is FIFO)
        self._closing = False
        if metrics:
            metrics.oldest_wait.set_function(self.oldest_wait)  # computed when scraped

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._pending - self._running

    def mean_service_seconds(self) -> float | None:
        """The average time recent requests held the worker; None before the first finished."""
        with self._lock:
            return self._service_seconds

    def retry_after(self) -> int:
        """Whole seconds for a 429's Retry-After (see the module's docstring)."""
        with self._lock:
            mean = self._service_seconds
        return 1 if mean is None else max(1, min(RETRY_AFTER_MAX, math.ceil(mean)))

    def oldest_wait(self) -> float:
        """Seconds the oldest request still queued has waited; 0 when none waits."""
        with self._lock:
            oldest = next(iter(self._queued), None)
        return 0.0 if oldest is None else time.monotonic() - oldest.submitted

    def _observe(self, seconds: float) -> None:
        with self._lock:
            old = self._service_seconds
            self._service_seconds = seconds if old is None else old + SERVICE_TIME_WEIGHT * (seconds - old)

    def submit(self, fn: Callable[[Job], Any], timeout: float, group: Hashable | None = None) -> Job:
        """Queue `fn(job)` on a model thread, or raise QueueFull. `group`: see the module docstring."""
        with self._lock:
            if self._pending >= 1 + self.max_queue:
                if self.metrics:
                    self.metrics.rejected.inc()
                raise QueueFull
            self._pending += 1
            job = Job(time.monotonic() + timeout)
            self._queued[job] = None
            ticket = self._ticket()

        def run() -> Any:
            self._admit(ticket, group)
            try:
                self._dequeue(job)
                if job.should_stop():
                    raise Cancelled("given up before it started")
                job.started = time.monotonic()
                with self._lock:
                    self._running += 1
                self._gauges()
                if self.metrics:
                    self.metrics.queue_time.observe(job.started - job.submitted)
                try:
                    with request_thread(), stop_when(job.should_stop):
                        return fn(job)
                except Interrupted:
                    if self.metrics:
                        self.metrics.stopped.inc()
                    raise Cancelled("stopped at a model step: the client left or the time limit passed") from None
                finally:
                    self._observe(time.monotonic() - job.started)
                    with self._lock:
                        self._running -= 1
            finally:
                self._leave()

        job.future = self._executor.submit(run)
        job.future.add_done_callback(lambda _: self._done(job))
        self._gauges()
        return job

    def submit_background(self, fn: Callable[[], None]) -> bool:
        """Queue `fn()` behind the requests already waiting, to run alone; False once shutting down (not run)."""
        with self._lock:
            if self._closing:
                return False
            ticket = self._ticket()

            def run() -> None:
                self._admit(ticket, None)
                try:
                    if not self._closing:
                        fn()
                finally:
                    self._leave()

            self._executor.submit(run)
            return True

    # -- admission: who runs beside whom ---------------------------------------------------
    def _ticket(self) -> int:
        self._tickets += 1
        return self._tickets

    def _admit(self, ticket: int, group: Hashable | None) -> None:
        """Block until this job may start: nothing runs, or its group runs with room to spare, and
        no earlier job is still waiting."""
        with self._admission:
            self._waiting_tickets.add(ticket)
            while not (min(self._waiting_tickets) == ticket and (
                    self._group_size == 0
                    or (group is not None and group == self._group and self._group_size < self.batch))):
                self._admission.wait()
            self._waiting_tickets.discard(ticket)
            self._group, self._group_size = group, self._group_size + 1
            self._admission.notify_all()  # the next in line may join the same group

    def _leave(self) -> None:
        with self._admission:
            self._group_size -= 1
            if self._group_size == 0:
                self._group = None
            self._admission.notify_all()

    def _dequeue(self, job: Job) -> None:
        with self._lock:
            self._queued.pop(job, None)

    def _done(self, job: Job) -> None:
        with self._lock:
            self._pending -= 1
            self._queued.pop(job, None)  # cancelled while queued: it never ran
        self._gauges()

    def _gauges(self) -> None:
        if self.metrics:
            with self._lock:
                self.metrics.waiting.set(self._pending - self._running)
                self.metrics.running.set(self._running)

    async def wait(self, job: Job, disconnected: Callable[[], Awaitable[bool]], poll: float = 0.25) -> Any:
        """The job's result; gives it up when the client disconnects or its deadline passes."""
        waiting = asyncio.wrap_future(job.future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=poll)
            if done:
                try:
                    return waiting.result()
                except Cancelled:  # the worker saw the time limit pass before this loop did
                    if time.monotonic() > job.deadline:
                        raise TimeoutError from None
                    raise
            if time.monotonic() > job.deadline:
                job.cancel()
                raise TimeoutError
            if await disconnected():
                job.cancel()
                raise Cancelled("client disconnected")

    def shutdown(self) -> None:
        """Finish the requests running and queued (graceful shutdown), then stop the thread;
        background work not started by then is dropped."""
        with self._lock:
            self._closing = True
        self._executor.shutdown(wait=True)
