"""New tool libraries too large for one prompt, embedded off the request path.

A library of more than `JOINT_TOOLS` tools is read per function: each tool takes one pass of the
large model before the first request can be answered (minutes for hundreds of tools on a CPU; on
disk afterwards). Done on the request path, that held the only model worker, and every request
behind it waited. Instead, the first request for such a library starts a job here and gets 429
with Retry-After (the job's time left as measured so far); so does every request for it until its
embeddings are on disk, and then it is served as any stored library.

A job runs on the model worker a step at a time (`ModelWorker.submit_background`): one step of the
oldest job, queued behind the requests already waiting, then the next. So a request that does not
need the library waits for at most one step, and a step is sized from the measured seconds per
tool to last half the worker's average request (`STEP_SHARE`): a request arriving mid-step waits
for the rest of it.

Bounded: at most `max_jobs` libraries at a time; another new one gets 429 too, with the time until
the first job ends. Cancellable: a job whose clients stopped asking (nobody came back within
`grace` seconds after the Retry-After it gave) is dropped at its next step, and shutdown stops all.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from hyfunc.formats.schema import Tool
from hyfunc.serving.errors import APIError
from hyfunc.serving.library_cache import fingerprint
from hyfunc.serving.metrics import ServerMetrics

log = logging.getLogger("hyfunc.serving")

FIRST_STEP_TOOLS = 2  # before a step is measured: a pass per tool takes ~0.1-1 s on a CPU
MAX_STEP_TOOLS = 64
DEFAULT_STEP_SECONDS = 1.0  # a step's length before any request has been timed
STEP_SHARE = 0.5  # of the worker's average request time: a step's length
SECONDS_PER_TOOL_GUESS = 0.5  # the Retry-After of a job not yet measured
MAX_RETRY_AFTER = 3600


@dataclass
class _Job:
    key: tuple[int, str]
    embedding: Any  # cascade.library.LibraryEmbedding: `remaining`, `step(max_tools)`
    tools: int
    asked: float  # the clock's time of the latest request for it
    patience: float = 0.0  # seconds that request was told to wait
    seconds_per_tool: float | None = None

    def eta(self) -> float:
        return self.embedding.remaining * (self.seconds_per_tool or SECONDS_PER_TOOL_GUESS)


class LibraryJobs:
    def __init__(
        self, submit: Callable[[Callable[[], None]], bool], step_seconds: Callable[[], float | None], max_jobs: int,
        grace: float, metrics: ServerMetrics, on_error: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        """`submit`: queues low-priority work on the model worker; `step_seconds`: the worker's
        average request time; `on_error`: called with what a step raised (a model failure stops the service)."""
        self._submit, self._step_seconds = submit, step_seconds
        self.max_jobs, self.grace, self.metrics, self._on_error = max_jobs, grace, metrics, on_error
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[int, str], _Job] = {}  # oldest first: the one stepped
        self._pumping = False  # a step is queued or running

    def admit(self, method: Any, tools: Sequence[Tool], disk_bytes: int) -> None:
        """Return when `method` can read `tools` without embedding them on the request path;
        else start (or look up) their job and refuse the request with 429 and Retry-After."""
        start = getattr(method, "library_embedding", None)
        if start is None:
            return
        key = (id(method), fingerprint(tools))
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                if len(self._jobs) >= self.max_jobs:
                    wait = _seconds(min(j.eta() for j in self._jobs.values()))
                    raise APIError(
                        429, f"the request's {len(tools)} tools are new to this server, which is already embedding "
                        f"{len(self._jobs)} other new libraries; retry in {wait} s",
                        param="tools", code="library_jobs_full", headers={"Retry-After": str(wait)},
                    )
                embedding = start(tools, disk_bytes)
                if embedding is None or embedding.remaining == 0:
                    return  # read in one prompt, or finished since the caller looked
                job = _Job(key, embedding, len(tools), self._clock())
                self._jobs[key] = job
                self.metrics.library_jobs.set(len(self._jobs))
                self._pump_locked()
            remaining = job.embedding.remaining
            if remaining == 0:
                return  # its last shard was written since the caller looked
            job.asked = self._clock()
            done = job.tools - remaining
            wait = _seconds(job.eta())
            job.patience = wait
        raise APIError(
            429, f"the request's {job.tools} tools are new to this server: they are being embedded, off the request "
            f"path ({done} of {job.tools} done); retry in {wait} s",
            param="tools", code="library_embedding", headers={"Retry-After": str(wait)},
        )

    def embedding(self, method: Any, tools: Sequence[Tool]) -> bool:
        """Whether a job embeds `tools` for `method` now (its requests need no other check)."""
        key = (id(method), fingerprint(tools))
        with self._lock:
            return key in self._jobs

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._jobs)

    def _pump_locked(self) -> None:
        if not self._pumping and self._jobs:
            self._pumping = self._submit(self._step)

    def _step(self) -> None:
        """On the model worker: one step of the oldest job still wanted, then queue the next."""
        with self._lock:
            now = self._clock()
            for key in [k for k, j in self._jobs.items() if now > j.asked + j.patience + self.grace]:
                log.info("library job %s dropped: no request for it in %.0f s", key[1], now - self._jobs[key].asked)
                del self._jobs[key]
            job = next(iter(self._jobs.values()), None)
        try:
            if job is not None:
                self._run(job)
        finally:
            with self._lock:
                self._pumping = False
                self.metrics.library_jobs.set(len(self._jobs))
                self._pump_locked()

    def _run(self, job: _Job) -> None:
        mean = self._step_seconds()
        target = STEP_SHARE * mean if mean else DEFAULT_STEP_SECONDS
        size = FIRST_STEP_TOOLS if job.seconds_per_tool is None else int(target / job.seconds_per_tool)
        started = time.perf_counter()
        try:
            done = job.embedding.step(max(1, min(MAX_STEP_TOOLS, size)))
        except Exception as err:  # noqa: BLE001 - the job ends; the service judges the error
            with self._lock:
                self._jobs.pop(job.key, None)
            log.exception("embedding a new library of %d tools failed", job.tools)
            self._on_error(err)
            return
        if done:
            per_tool = (time.perf_counter() - started) / done
            job.seconds_per_tool = per_tool if job.seconds_per_tool is None else (job.seconds_per_tool + per_tool) / 2
            self.metrics.library_job_tools.inc(done)
        if job.embedding.remaining == 0:
            with self._lock:
                self._jobs.pop(job.key, None)


def _seconds(estimate: float) -> int:
    return max(1, min(MAX_RETRY_AFTER, math.ceil(estimate)))
