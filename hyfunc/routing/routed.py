"""Routing: per request, the router sends the request to the small path or to the cascade.

A *routing directory* (what `--router DIR` names) is either

- versions written by `hyfunc odia cycle`, in a directory (`aliases.json` + `versions/<id>/`) or
  in PostgreSQL (a URL: replicas share them, hyfunc.routing.registry): the champion version is
  served, and a promotion or rollback is picked up without a restart (the champion is polled; the
  new version loads in the background and is swapped in between requests, so none is dropped);
  before any promotion everything goes to the cascade;
- one version directory: ``router/`` (hyfunc.routing.router) and ``small/`` (small.json naming
  the base small model, its LoRA ``adapter/`` and the tool ``selector/``). A version whose small
  model is the cascade's own, unchanged (no distillation), names the adapter "cascade" with its
  sha256 instead of copying it: it is loaded with the cascade it is routed against, and refused
  with any other.

`RoutedMethod` is a `Method` (Python API, `hyfunc call/eval --router`); its answers say which path
answered in `details["path"]`. The server uses the same object through `server_paths()` and
`route_prepared`: the router's slot picks "small" or "cascade" before the request is queued.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from hyfunc.cascade.library import DISK_CACHE_BYTES
from hyfunc.cascade.selector import ToolSelector, ToolVectors
from hyfunc.formats.messages import conversation_text
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer
from hyfunc.methods.small import SmallMethod
from hyfunc.models.minilm import Embedder, MiniLMEmbedder
from hyfunc.routing.router import Router
from hyfunc.routing.store import StoreError
from hyfunc.routing.versions import VersionStore

log = logging.getLogger("hyfunc.routing")

SMALL_MANIFEST = "small.json"
CASCADE_ADAPTER = "cascade"  # small.json's adapter when it is the cascade artifact's own
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # what defines a LoRA adapter (peft)
SMALL_FIRST = "small_first"  # the server's path for a router that reads the small path's answer


class SharedEmbedder:
    """One MiniLM for the router and the selector, which embed the same request text: the last
    texts' vectors are kept, so a routed request is embedded once; and one tool-vector cache for
    the gate and every version's selector. Thread-safe: the server's
    router runs in the event loop while the small path runs on the model worker."""

    def __init__(self, embedder: Embedder | None = None, size: int = 256):
        self.inner = embedder or MiniLMEmbedder()
        self.name = self.inner.name
        self.tool_vectors = ToolVectors(self.inner)  # one cache for every gate and selector embedding with it
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
            if missing:
                for text, vector in zip(missing, self.inner.embed(missing)):
                    self._memo[text] = vector
            for text in texts:
                self._memo.move_to_end(text)
            out = np.stack([self._memo[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)
            while len(self._memo) > self._size:
                self._memo.popitem(last=False)
            return out


@dataclass(frozen=True)
class Routing:
    """What one version serves; replaced whole, never edited, so a request sees one version."""

    small: SmallMethod | None  # None before any version: nothing is routed
    router: Router | None  # None: everything goes to the cascade
    version: str | None


def small_description(base_model: str, adapter: str | None, adapter_sha256: str | None = None) -> dict:
    """small.json. `adapter`: "adapter" (a directory beside it), CASCADE_ADAPTER (the cascade's own
    adapter, pinned by `adapter_sha256`), or None (the base model alone)."""
    description = {"format": "hyfunc-small-path", "version": 1, "base_model": base_model, "adapter": adapter,
                   "selector": "selector"}
    if adapter_sha256 is not None:
        description["adapter_sha256"] = adapter_sha256
    return description


def adapter_sha256(directory: Path) -> str:
    """One digest of the files that define a LoRA adapter (not its README)."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        digest.update(name.encode("utf-8") + b"\0" + (directory / name).read_bytes())
    return digest.hexdigest()


def artifact_adapter(artifact: str | Path | None) -> Path | None:
    """The LoRA adapter of a cascade artifact's small model, if it has one."""
    adapter = Path(artifact) / "adapter" if artifact is not None else None
    return adapter if adapter is not None and adapter.is_dir() else None


def cascade_adapter_of(cascade: Any) -> Path | None:
    """The adapter of a loaded cascade's small model (`artifact_adapter` of the directory it was loaded from)."""
    return artifact_adapter(getattr(cascade, "artifact", None))


def _adapter(directory: Path, description: dict, cascade_adapter: Path | None) -> Path | None:
    name = description.get("adapter")
    if name != CASCADE_ADAPTER:
        return directory / name if name else None
    pinned = description.get("adapter_sha256", "")
    if cascade_adapter is None:
        raise FileNotFoundError(f"{directory}: its small model is the adapter of the cascade it was trained against "
                                f"(sha256 {pinned[:12]}…); load it with that cascade")
    found = adapter_sha256(cascade_adapter)
    if found != pinned:
        raise ValueError(f"{directory}: its small model is the adapter of the cascade it was trained against (sha256 "
                         f"{pinned[:12]}…), not {cascade_adapter} ({found[:12]}…)")
    return cascade_adapter


def open_small(base_model: str, adapter: Path | None, selector: Path, embedder: Embedder, engine: str = "auto",
               device: str | None = None, version: str | None = None) -> SmallMethod:
    """A small path from its parts: the base model, its LoRA adapter, the tool selector."""
    from hyfunc.models.engines import load_backend

    backend = load_backend(base_model, engine, device=device, adapter=adapter, role="small")
    return SmallMethod(backend, ToolSelector.load(selector, embedder), version=version)


def load_small(directory: str | Path, embedder: Embedder, engine: str = "auto", device: str | None = None,
               version: str | None = None, cascade_adapter: Path | None = None) -> SmallMethod:
    """The small path of a version's ``small/`` directory, on `engine`; `cascade_adapter`: the adapter
    of the cascade routed against (needed when small.json names the cascade's adapter)."""
    directory = Path(directory)
    description = json.loads((directory / SMALL_MANIFEST).read_text())
    return open_small(description["base_model"], _adapter(directory, description, cascade_adapter),
                      directory / description["selector"], embedder, engine, device, version)


def load_version(directory: str | Path, embedder: Embedder, engine: str = "auto", device: str | None = None,
                 version: str | None = None, cascade_adapter: Path | None = None) -> Routing:
    directory = Path(directory)
    router = Router.load(directory / "router", embedder=embedder)
    return Routing(load_small(directory / "small", embedder, engine, device, version, cascade_adapter), router,
                   version)


class RoutedMethod:
    """A `Method`: the router's choice between `small` (a SmallMethod) and `cascade`."""

    name = "routed"

    def __init__(self, cascade: Any, routing: Routing, embedder: SharedEmbedder | None = None,
                 explore: float = 0.0, seed: int = 0):
        self.cascade, self.routing = cascade, routing
        self.embedder = embedder
        gate = getattr(cascade, "gate", None)
        if gate is not None and embedder is not None:
            gate.share_embedder(embedder)  # one MiniLM: the request is embedded once for gate, router and selector
        # Exploration: a share of the requests the router sends to the small path goes to the
        # cascade anyway, so the log keeps teacher answers where the small path serves (without
        # them, later cycles would learn from the hard requests only).
        self.explore = explore
        self._rng = random.Random(seed)
        self._watch: tuple[VersionStore, float, str | None] | None = None  # (versions, poll s, champion)
        self._next_poll = 0.0
        self._loading = threading.Lock()
        self._engine, self._device = "auto", None
        self.small_slot = _SmallSlot(self)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def load(cls, cascade: Any, directory: str | Path, engine: str = "auto", device: str | None = None,
             poll_seconds: float = 2.0, embedder: SharedEmbedder | None = None) -> "RoutedMethod":
        """Route between `cascade` and the small path of `directory` (see the module docstring).
        A versions directory without a champion yet routes nothing until one is promoted."""
        from hyfunc.routing.registry import is_registry_url, open_versions

        embedder = embedder or SharedEmbedder()
        adapter = cascade_adapter_of(cascade)
        path = Path(directory)
        if not is_registry_url(directory) and (path / "router").is_dir() and (path / "small").is_dir():
            method = cls(cascade, load_version(path, embedder, engine, device, path.name, adapter), embedder)
        elif is_registry_url(directory) or (path / "aliases.json").is_file() or (path / "versions").is_dir():
            versions = open_versions(directory)
            champion = versions.champion
            if champion is None:
                routing = Routing(None, None, None)
            else:
                routing = load_version(versions.path(champion), embedder, engine, device, champion, adapter)
            method = cls(cascade, routing, embedder)
            method._watch = (versions, poll_seconds, champion)
        else:
            raise FileNotFoundError(f"{directory}: neither a versions directory or PostgreSQL URL (hyfunc odia "
                                    "cycle --out) nor a version (router/ and small/)")
        method._engine, method._device = engine, device
        if method.routing.router is not None and method.routing.router.needs_small_answer:
            log.info("router %s reads the small path's answer: requests run the small path first",
                     method.routing.version)
        return method

    # -- the champion, picked up while serving --------------------------------------------
    def _poll(self) -> None:
        """Cheap (one small read of the champion every poll interval); loading runs in a thread."""
        if self._watch is None or time.monotonic() < self._next_poll:
            return
        versions, every, known = self._watch
        self._next_poll = time.monotonic() + every
        try:
            champion = versions.champion
        except (OSError, ValueError, StoreError) as err:
            log.warning("cannot read the champion in %s: %s", versions, err)
            return
        if champion == known or champion is None or not self._loading.acquire(blocking=False):
            return
        threading.Thread(target=self._switch, args=(versions, champion), name="hyfunc-routing-load", daemon=True).start()

    def _switch(self, versions: VersionStore, champion: str) -> None:
        try:
            routing = load_version(versions.path(champion), self.embedder or SharedEmbedder(), self._engine,
                                   self._device, champion, cascade_adapter_of(self.cascade))
            self.routing = routing  # one assignment: a request sees the old version or the new one
            self._watch = (versions, self._watch[1] if self._watch else 2.0, champion)
            log.info("now serving version %s", champion)
        except Exception:  # noqa: BLE001 - keep serving the current version; retried at the next poll
            log.exception("loading version %s failed", champion)
        finally:
            self._loading.release()

    def wait_for(self, version: str, timeout: float = 60.0) -> bool:
        """Until `version` is served (tests, scripts); polls as serving does."""
        deadline = time.monotonic() + timeout
        while self.routing.version != version and time.monotonic() < deadline:
            self._next_poll = 0.0
            self._poll()
            time.sleep(0.05)
        return self.routing.version == version

    # -- deciding ----------------------------------------------------------------------------
    def routable(self, messages: Sequence[dict], tools: Sequence[Tool], routing: Routing | None = None) -> bool:
        """Whether the router decides this request at all (else the cascade answers it)."""
        routing = routing or self.routing
        if routing.router is None or routing.small is None or not tools or not conversation_text(messages):
            return False
        gate = getattr(self.cascade, "gate", None)
        # Maybe small talk: the cascade's gate decides with the large model's state (or dismisses it
        # with no large-model pass when an English request is far from every tool).
        return gate is None or not gate.suspects(self.cascade.gate_text(messages), tools)

    def choose(self, messages: Sequence[dict], tools: Sequence[Tool], routing: Routing | None = None,
               small_answer: Answer | None = None) -> tuple[str, float | None]:
        """("small" | "cascade", the router's score)."""
        routing = routing or self.routing
        if not self.routable(messages, tools, routing):
            return "cascade", None
        return self._decide(messages, tools, routing, small_answer)

    def _decide(self, messages: Sequence[dict], tools: Sequence[Tool], routing: Routing,
                small_answer: Answer | None) -> tuple[str, float | None]:
        """The router's choice for a routable request."""
        calls = confidence = None
        gave_up, near_fit = False, ()
        if routing.router.needs_small_answer:
            if small_answer is None:
                raise ValueError("this router reads the small path's answer: run it first")
            calls, confidence = small_answer.calls, small_answer.details.get("confidence")
            gave_up = bool(small_answer.details.get("gave_up"))  # its confidence fell below the router's floor
            near_fit = small_answer.details.get("near_fit", ())
        path, score, escalated = routing.router.decide(messages, tools, calls, confidence, gave_up, near_fit)
        if escalated:
            small_answer.details["escalated"] = escalated
        return ("small" if path == "small" else "cascade"), score

    def _explored(self, path: str) -> tuple[str, bool]:
        if path == "small" and self.explore > 0 and self._rng.random() < self.explore:
            return "cascade", True
        return path, False

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool]) -> Answer:
        self._poll()
        routing = self.routing
        start = time.perf_counter()
        small_answer = None
        routable = self.routable(messages, tools, routing)
        if routable and routing.router.needs_small_answer:
            # Small first: the router reads its answer, and it stops early when the router would escalate anyway.
            floor = routing.router.confidence_floor(messages, tools, routing.small.decoder.max_calls)
            small_answer = routing.small.answer(messages, tools, give_up_below=floor)
        path, score = self._decide(messages, tools, routing, small_answer) if routable else ("cascade", None)
        path, explored = self._explored(path)
        route_seconds = time.perf_counter() - start - (small_answer.latency if small_answer else 0.0)
        answer = small_answer if path == "small" and small_answer is not None else (
            routing.small.answer(messages, tools) if path == "small" else self.cascade.answer(messages, tools))
        if small_answer is not None and path == "cascade":
            answer.timings.update({f"tried_{k}": v for k, v in small_answer.timings.items()})
            if "escalated" in small_answer.details:
                answer.details["escalated"] = small_answer.details["escalated"]
        answer.timings["route"] = route_seconds
        answer.details.update({"path": path, "router_score": score, "version": routing.version, "explored": explored})
        return answer

    @property
    def config(self) -> dict:
        """What a report records about this method (hyfunc.eval.bfcl.run_metadata)."""
        routing = self.routing
        return {"cascade": getattr(self.cascade, "config", None), "version": routing.version,
                "router_threshold": None if routing.router is None else routing.router.threshold,
                "small": None if routing.small is None else routing.small.config, "explore": self.explore}

    @property
    def large(self) -> Any:
        """The cascade's large model (side-by-side evaluations share it)."""
        return self.cascade.large

    def share_large_pass(self, other: Any) -> None:
        self.cascade.share_large_pass(other)

    def use_library(self, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> None:
        if hasattr(self.cascade, "use_library"):
            self.cascade.use_library(tools, disk_cache_bytes)

    # -- the server's slots ----------------------------------------------------------------
    def server_paths(self) -> dict[str, Any]:
        """Methods by path for `create_app`; the cascade first (the server sizes its context by it).
        "small_first" serves a router that reads the small path's answer: it is decided on the
        model worker, after the small path has answered (see `_SmallFirstSlot`)."""
        return {"cascade": self.cascade, "small": self.small_slot, SMALL_FIRST: _SmallFirstSlot(self)}

    def route_prepared(self, prepared: Any) -> str:
        """The server's router slot (hyfunc.serving.service.Router), run before the request is queued."""
        self._poll()
        if prepared.choice != "auto":
            return "cascade"  # forced or named calls, no-tool replies: the cascade's rules apply
        messages, routing = prepared.conversation.method_messages(), self.routing
        if routing.router is not None and routing.router.needs_small_answer:
            return SMALL_FIRST if self.routable(messages, prepared.tools, routing) else "cascade"
        path, _ = self.choose(messages, prepared.tools, routing)
        return self._explored(path)[0]


class _SmallSlot:
    """The small path as the server sees it: always the current version's."""

    path = "small"

    def __init__(self, routed: RoutedMethod):
        self._routed = routed

    @property
    def name(self) -> str:
        small = self._routed.routing.small
        return "small" if small is None else small.name

    @property
    def backend(self) -> Any:  # writes this path's text replies and forced calls
        return self._current().backend

    def _current(self) -> SmallMethod:
        small = self._routed.routing.small
        if small is None:  # the router routes nothing here before a version is promoted
            raise RuntimeError("no small path is loaded yet")
        return small

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool]) -> Answer:
        return self._current().answer(messages, tools)


class _SmallFirstSlot:
    """The server's path for a small-first router: the routed method answers (the small path, then
    the cascade when the router doubts its answer), and `answered_by` names the method that did,
    so the server writes text replies with it and logs that path (escalated requests are teacher
    answers for the next cycle)."""

    path = SMALL_FIRST
    name = "routed"

    def __init__(self, routed: RoutedMethod):
        self._routed = routed

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool]) -> Answer:
        return self._routed.answer(messages, tools)

    def answered_by(self, answer: Answer) -> tuple[str, Any]:
        if answer.details.get("path") == "small":
            return "small", self._routed.small_slot
        return "cascade", self._routed.cascade

    # A library too large for one prompt is read per function by the cascade (the small path's
    # selector ranks any number of tools): the server checks and caches it through this slot.
    def library_mode(self, n_tools: int) -> str | None:
        mode = getattr(self._routed.cascade, "library_mode", None)
        return None if mode is None else mode(n_tools)

    def library_stored(self, tools: Sequence[Tool]) -> bool:
        stored = getattr(self._routed.cascade, "library_stored", None)
        return stored is not None and stored(tools)

    def library_embedding(self, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> Any:
        embedding = getattr(self._routed.cascade, "library_embedding", None)
        return None if embedding is None else embedding(tools, disk_cache_bytes)

    def use_library(self, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> None:
        self._routed.use_library(tools, disk_cache_bytes)

    def library_state(self) -> Any:
        return self._routed.cascade.library_state()

    def set_library_state(self, state: Any) -> None:
        self._routed.cascade.set_library_state(state)


def routed_serving(load_cascade: Callable[[], Any], directory: str | Path, engine: str = "auto",
                   device: str | None = None, poll_seconds: float = 2.0, explore: float = 0.0,
                   ) -> tuple[Callable[[], dict[str, Any]], Callable[[Any], str]]:
    """(loader, router) for `create_app(loader, router=router)`: the loader (run in the background
    at start-up) loads the cascade and the routing directory; the router routes with them."""
    holder: list[RoutedMethod] = []

    def load() -> dict[str, Any]:
        routed = RoutedMethod.load(load_cascade(), directory, engine, device, poll_seconds)
        routed.explore = explore
        holder.append(routed)
        return routed.server_paths()

    def route(prepared: Any) -> str:
        return holder[0].route_prepared(prepared)  # called only once the app is ready: loaded

    return load, route
