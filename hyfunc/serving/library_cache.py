"""Tool-library reuse for the cascade: requests that carry the same tools share its library state.

`HyFuncMethod.use_library(tools)` computes the large model's KV cache of [instruction + tools] and
the function embeddings (or, past the joint-prompt limit, the per-function embeddings and the
lexical index); its `answer` then runs only the request's tokens. The method holds ONE library;
this LRU keeps several, keyed by a fingerprint of the canonical tools (key order inside a schema
does not matter; tool order does, as it changes the prompt), bounded by count and tensor bytes.

It swaps the method's library state in and out through the cascade's public API
(`library_state()` / `set_library_state(state)`); any method with `use_library` and those two
takes part. The first request with a new library pays for it: a joint library's prefix pass, or,
for a library read per function, the per-function embeddings (computed once per model and
library and cached on disk, see `cascade.library.library_embeddings`, so only the first request
ever pays that, which takes long for thousands of tools). `holds` tells the server, before it
queues a request, whether its library costs nothing new (`ChatService` caps what a new one may cost).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import torch

from hyfunc.cascade.library import DISK_CACHE_BYTES
from hyfunc.formats.schema import Tool
from hyfunc.routing.store import library_fingerprint
from hyfunc.serving.metrics import ServerMetrics


def fingerprint(tools: Sequence[Tool]) -> str:
    """The traffic log's library fingerprint of the tools' canonical schemas (any key order)."""
    return library_fingerprint([t.to_json_schema() for t in tools])


def tensor_bytes(obj: Any, depth: int = 0, seen: set[int] | None = None) -> int:
    """Bytes of the tensors and numpy arrays reachable from `obj` (a KV cache, embeddings, a
    lexical index, dataclasses of them)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, depth + 1, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, depth + 1, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(tensor_bytes(v, depth + 1, seen) for v in vars(obj).values())
    return 0


class LibraryCache:
    """`max_entries` libraries in at most `max_bytes` of memory; `disk_bytes`: the bound of the
    per-function embeddings' cache on disk, handed to `use_library`."""

    def __init__(self, max_entries: int, max_bytes: int, metrics: ServerMetrics | None = None, disk_bytes: int = DISK_CACHE_BYTES):
        self.max_entries, self.max_bytes, self.disk_bytes = max_entries, max_bytes, disk_bytes
        self.metrics = metrics
        self._entries: OrderedDict[tuple[int, str], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()  # `holds` runs in the event loop, beside the worker's changes
        self.hits = self.misses = 0

    @staticmethod
    def supports(method: Any) -> bool:
        return all(hasattr(method, name) for name in ("use_library", "library_state", "set_library_state"))

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self._entries.values())

    def holds(self, method: Any, tools: Sequence[Tool]) -> bool:
        """Whether `select(method, tools)` would build nothing: the state is held in memory, or
        the method finds the per-function embeddings on disk (`library_stored`)."""
        if self.supports(method) and self.max_entries > 0:
            with self._lock:
                if (id(method), fingerprint(tools)) in self._entries:
                    return True
        stored = getattr(method, "library_stored", None)
        return stored is not None and stored(tools)

    def select(self, method: Any, tools: Sequence[Tool]) -> tuple[bool, float]:
        """Make `method`'s library state that of `tools`: (reused?, seconds spent building).
        Call from the model worker only (the state is the method's, not thread-safe)."""
        if not self.supports(method) or not tools:
            return False, 0.0
        if self.max_entries <= 0:
            mode = getattr(method, "library_mode", None)
            if mode is not None and mode(len(tools)) == "per_function":
                # Cache off, but such a library is only read through its state: build it every time.
                start = time.perf_counter()
                method.use_library(list(tools), self.disk_bytes)
                return False, time.perf_counter() - start
            return False, 0.0
        key = (id(method), fingerprint(tools))
        with self._lock:
            held = self._entries.get(key)
            if held is not None:
                self._entries.move_to_end(key)
        if held is not None:
            method.set_library_state(held[0])
            self.hits += 1
            if self.metrics:
                self.metrics.library_hits.inc()
            return True, 0.0
        start = time.perf_counter()
        method.use_library(list(tools), self.disk_bytes)
        seconds = time.perf_counter() - start
        state = method.library_state()
        size = tensor_bytes(state)
        self.misses += 1
        with self._lock:
            self._entries[key] = (state, size)
            while len(self._entries) > self.max_entries or (len(self._entries) > 1 and self.bytes > self.max_bytes):
                self._entries.popitem(last=False)  # least recently used; the new entry always stays
        if self.metrics:
            self.metrics.library_misses.inc()
            self.metrics.library_entries.set(len(self._entries))
            self.metrics.library_bytes.set(self.bytes)
        return False, seconds
