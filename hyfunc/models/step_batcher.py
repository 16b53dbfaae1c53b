"""Batching across requests: the model steps of concurrent requests run as one engine call.

The server's worker may run several requests at once, each in its own thread, through the same
straight-line method code (`hyfunc serve --batch N`). Each time a request thread needs a forward
pass of a model (a prefill chunk, one decode step), it hands the step to that model's
`StepBatcher` and blocks. The first blocked thread becomes the leader: it waits until every other
running request is blocked too (on this model or another one) or a short window has passed, then
runs every compatible waiting step in one call (`run(pieces)`: one llama_decode with one sequence
id per request) and wakes their threads. On a CPU a decode step reads all the weights for one
token; `scripts/batched_decode_speed.py` measures what sharing that read across sequences gives.

Threads that are not registered as requests (`request_thread()`) are not waited for: a lone
request, a library job or a test runs its steps at once, as without batching.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

Piece = TypeVar("Piece")

#: How long a leader waits for running requests to reach their next step; a decode step takes
#: tens of milliseconds, so this costs little when a request is busy elsewhere (retrieval, parsing).
WINDOW_SECONDS = 0.004

_cond = threading.Condition()  # one for every batcher: "every request is blocked" spans models
_running = 0  # registered request threads
_blocked = 0  # of them, waiting in some batcher
_local = threading.local()


@contextmanager
def request_thread() -> Iterator[None]:
    """Count the calling thread as a running request while inside: leaders wait for its steps."""
    global _running
    with _cond:
        _running += 1
    _local.request = True
    try:
        yield
    finally:
        _local.request = False
        with _cond:
            _running -= 1
            _cond.notify_all()  # a leader may be waiting for this thread's step


class StepBatcher(Generic[Piece]):
    def __init__(self, run: Callable[[list[Piece]], None], fits: Callable[[list[Piece], Piece], bool],
                 window: float = WINDOW_SECONDS, on_run: Callable[[int], None] | None = None):
        """`run(pieces)`: one engine call for all; `fits(group, piece)`: whether `piece` may join
        `group`; `on_run(n)`: told the number of pieces of each call (metrics)."""
        self._run, self._fits, self.window, self._on_run = run, fits, window, on_run
        self._pending: list[Piece] = []
        self._results: dict[int, BaseException | None] = {}  # id(piece) -> its run's error, once run
        self._counted: set[int] = set()  # pieces of registered request threads, not yet run
        self._busy = False

    def submit(self, piece: Piece) -> None:
        """Run `piece` with whatever other requests' steps are ready; returns once it has run."""
        global _blocked
        with _cond:
            self._pending.append(piece)
            if getattr(_local, "request", False):
                # Blocked until its call has run (`_lead` counts it out then, not when this thread
                # wakes: a leader must not take a request whose step is done for a blocked one).
                _blocked += 1
                self._counted.add(id(piece))
            _cond.notify_all()
            while id(piece) not in self._results:
                if self._busy:
                    _cond.wait()
                    continue
                self._lead()
            error = self._results.pop(id(piece))
        if error is not None:
            raise error

    def _lead(self) -> None:
        """Called holding `_cond`: gather, run one group (the condition released meanwhile), publish."""
        global _blocked
        self._busy = True
        deadline = time.monotonic() + self.window
        while _running > _blocked and (left := deadline - time.monotonic()) > 0:
            _cond.wait(left)
        group: list[Piece] = []
        rest: list[Piece] = []
        for piece in self._pending:  # oldest first; the first always fits
            (group if not group or self._fits(group, piece) else rest).append(piece)
        self._pending = rest
        _cond.release()
        error: BaseException | None = None
        try:
            self._run(group)
            if self._on_run is not None:
                self._on_run(len(group))
        except BaseException as err:  # every step of the group failed with it
            error = err
        finally:
            _cond.acquire()
            for piece in group:
                self._results[id(piece)] = error
                if id(piece) in self._counted:
                    self._counted.discard(id(piece))
                    _blocked -= 1
            self._busy = False
            _cond.notify_all()
