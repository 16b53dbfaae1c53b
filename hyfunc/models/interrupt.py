"""Stopping a request's model work at its next step.

A server gives a request up when its client leaves or its time limit passes. The work runs in the
request's own thread, through method code (the cascade's stages, a direct prompt) that knows
nothing of clients, so the engines ask instead: before every forward pass, `check()` calls the
predicate the thread registered with `stop_when`, and raises `Interrupted` once it says stop.
Threads that registered nothing (the CLI, benchmarks, a library job) never stop.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_local = threading.local()


class Interrupted(Exception):
    """A forward pass was not run because its thread's work was given up. Not a model failure
    (not a RuntimeError): the caches are as they were before the pass."""


@contextmanager
def stop_when(predicate: Callable[[], bool]) -> Iterator[None]:
    """Model steps of the calling thread raise `Interrupted` while inside, once `predicate()` is true."""
    previous = getattr(_local, "predicate", None)
    _local.predicate = predicate
    try:
        yield
    finally:
        _local.predicate = previous


def check() -> None:
    """Called by the engines before each forward pass."""
    predicate = getattr(_local, "predicate", None)
    if predicate is not None and predicate():
        raise Interrupted("the request was given up before its next model step")
