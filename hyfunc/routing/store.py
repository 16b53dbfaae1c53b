"""The traffic store: one interface over SQLite (embedded default) and PostgreSQL (shared log).

What is kept per answered request: the tool library by fingerprint (the tools themselves once per
fingerprint, since a server offers the same library on most requests), the conversation, the
answer (calls or text), the path and model versions that produced it, per-stage latency, token
counts, the time, and optional feedback. Mining adds one label row per request (see mining.py).
Deleting a request (retention, or forgetting it by id) deletes its label with it, and a tool
library once no request refers to it any more.

Both backends share the logical schema, the row encoding and the query semantics defined here;
they differ only in SQL dialect, connection handling and how concurrent migrators (and deleters
of unused tool libraries) are serialised.
"""
from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from hyfunc.errors import InputError, SetupError
from hyfunc.formats.calls import call_record
from hyfunc.routing.record import ServedRequest

FEEDBACK = ("good", "bad")
# Paths on which the large model produced the answer: mining compares the small path against these.
LARGE_PATHS = ("cascade", "large", "direct")


class StoreError(SetupError):
    """A traffic-store failure; the message is one line meant for the user."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or opened (database down, file not writable)."""


class UnknownRequest(StoreError):
    """No logged request has this id."""


def canonical_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools as canonical JSON (sorted keys, no whitespace): equal libraries give equal text,
    whatever key order the client sent. Tool order is kept: it is part of what the model read."""
    return json.dumps(list(tools), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def library_fingerprint(tools: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(canonical_tools(tools).encode("utf-8")).hexdigest()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class EncodedRequest:
    """One ServedRequest turned into column values; encoding fails here, in the writer, rather
    than half-way through a database transaction."""

    request_id: str
    created: float
    fingerprint: str
    tools_json: str
    n_tools: int
    messages_json: str
    calls_json: str
    text: str
    path: str
    models_json: str
    timings_json: str
    input_tokens: int
    output_tokens: int
    injected_tokens: int
    error: str | None

    def request_row(self) -> tuple:
        return (
            self.request_id, self.created, self.fingerprint, self.messages_json, self.calls_json,
            self.text, self.path, self.models_json, self.timings_json, self.input_tokens,
            self.output_tokens, self.injected_tokens, self.error,
        )


REQUEST_COLUMNS = (
    "request_id, created, library, messages, calls, text, path, models, timings, "
    "input_tokens, output_tokens, injected_tokens, error"
)


def encode(request: ServedRequest) -> EncodedRequest:
    """Raises ValueError/TypeError for a record that cannot be stored (not JSON, NaN timing)."""
    if not isinstance(request.created, (int, float)) or not math.isfinite(request.created):
        raise ValueError(f"request {request.request_id}: created must be a finite timestamp")
    tools_json = canonical_tools(request.tools)
    return EncodedRequest(
        request_id=str(request.request_id),
        created=float(request.created),
        fingerprint=hashlib.sha256(tools_json.encode("utf-8")).hexdigest(),
        tools_json=tools_json,
        n_tools=len(request.tools),
        messages_json=_dumps(list(request.messages)),
        calls_json=_dumps([call_record(c) for c in request.calls]),
        text=_no_nul(request.text or ""),
        path=_no_nul(str(request.path)),
        models_json=_dumps(dict(request.models)),
        timings_json=_dumps({k: float(v) for k, v in request.timings.items()}),
        input_tokens=int(request.input_tokens),
        output_tokens=int(request.output_tokens),
        injected_tokens=int(request.injected_tokens),
        error=None if request.error is None else _no_nul(str(request.error)),
    )


def _no_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL; one such character from a model would otherwise make the
    # whole batch fail on every retry. JSON columns are safe: json.dumps escapes it.
    return text.replace("\x00", "\ufffd")


@dataclass
class StoredRequest:
    """A logged request as read back: the served record plus what the store adds."""

    request: ServedRequest
    library: str  # the tool library's fingerprint
    feedback: str | None = None  # good | bad | None
    feedback_at: float | None = None


@dataclass
class Label:
    """Mining's verdict on one request: did the small path reproduce the large path's calls?"""

    request_id: str
    simple: bool
    small_calls: list[dict]
    features: dict[str, float]  # scalar routing features, by name
    embedding: list[float] | None = None  # sentence embedding of the request
    embedder: str = ""  # which embedding model produced it
    small_path: str = ""  # which small path (model/version) was compared
    labelled: float = 0.0


@dataclass
class StoreStats:
    total: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    by_library: list[dict] = field(default_factory=list)  # {fingerprint, n_tools, requests}
    feedback: dict[str, int] = field(default_factory=dict)  # good | bad | none
    errors: int = 0
    labelled: int = 0
    simple: int = 0
    first: float | None = None
    last: float | None = None
    schema_version: int = 0


@dataclass(frozen=True)
class Retention:
    """How much traffic to keep: requests newer than `days`, and at most the newest `rows` of them;
    None = no limit. Raises InputError for a limit that would make no sense as a setting."""

    days: float | None = None
    rows: int | None = None

    def __post_init__(self) -> None:
        if self.days is not None and not (math.isfinite(self.days) and self.days > 0):
            raise InputError(f"days of traffic to keep must be a positive number, got {self.days:g}")
        if self.rows is not None and self.rows < 1:
            raise InputError(f"requests to keep must be at least 1, got {self.rows}")

    @property
    def unlimited(self) -> bool:
        return self.days is None and self.rows is None


@dataclass(frozen=True)
class Query:
    """Filters for iterating logged requests; None means no filter. Times are Unix seconds,
    `since` inclusive and `until` exclusive, so consecutive windows never overlap."""

    since: float | None = None
    until: float | None = None
    paths: tuple[str, ...] | None = None
    library: str | None = None
    without_error: bool = False
    unlabelled_only: bool = False  # only requests mining has not labelled yet
    limit: int | None = None

    def where(self, placeholder: str) -> tuple[str, list]:
        """A WHERE clause over the `requests r` alias, in the backend's placeholder style."""
        clauses: list[str] = []
        params: list = []
        if self.since is not None:
            clauses.append(f"r.created >= {placeholder}")
            params.append(float(self.since))
        if self.until is not None:
            clauses.append(f"r.created < {placeholder}")
            params.append(float(self.until))
        if self.paths is not None:
            if not self.paths:
                clauses.append("1 = 0")
            else:
                clauses.append(f"r.path IN ({', '.join([placeholder] * len(self.paths))})")
                params.extend(self.paths)
        if self.library is not None:
            clauses.append(f"r.library = {placeholder}")
            params.append(self.library)
        if self.without_error:
            clauses.append("r.error IS NULL")
        if self.unlabelled_only:
            clauses.append("NOT EXISTS (SELECT 1 FROM labels l WHERE l.request_id = r.request_id)")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


REQUEST_SELECT = (
    "SELECT r.request_id, r.created, r.library, r.messages, r.calls, r.text, r.path, r.models, "
    "r.timings, r.input_tokens, r.output_tokens, r.injected_tokens, r.error, r.feedback, "
    "r.feedback_at, t.tools FROM requests r JOIN libraries t ON t.fingerprint = r.library"
)


def decode_row(row: Sequence[Any], tools_cache: dict[str, list[dict]]) -> StoredRequest:
    """One REQUEST_SELECT row -> StoredRequest. Tools are parsed once per library: a long
    iteration over one server's traffic would otherwise re-parse the same library per row."""
    (request_id, created, library, messages, calls, text, path, models, timings, input_tokens,
     output_tokens, injected_tokens, error, feedback, feedback_at, tools) = row
    if library not in tools_cache:
        tools_cache[library] = json.loads(tools)
    served = ServedRequest(
        messages=json.loads(messages),
        tools=tools_cache[library],
        calls=json.loads(calls),
        text=text or "",
        path=path,
        models=json.loads(models),
        timings=json.loads(timings),
        input_tokens=int(input_tokens),
        output_tokens=int(output_tokens),
        injected_tokens=int(injected_tokens),
        error=error,
        request_id=request_id,
        created=float(created),
    )
    return StoredRequest(served, library, feedback, None if feedback_at is None else float(feedback_at))


def check_feedback(value: str) -> str:
    if value not in FEEDBACK:
        raise StoreError(f"feedback must be one of {', '.join(FEEDBACK)}, got {value!r}")
    return value


class TrafficStore(ABC):
    """A durable traffic log. Methods are safe to call from several threads; several processes
    may write to the same store at once. Writing a request id twice keeps the first copy, so a
    writer may retry a batch whose commit it could not confirm."""

    url: str

    @abstractmethod
    def write(self, requests: Sequence[EncodedRequest]) -> None:
        """Store a batch in one transaction (all or nothing)."""

    @abstractmethod
    def iter_requests(self, query: Query = Query()) -> Iterator[StoredRequest]:
        """Logged requests matching `query`, oldest first."""

    @abstractmethod
    def get(self, request_id: str) -> StoredRequest:
        """Raises UnknownRequest."""

    @abstractmethod
    def set_feedback(self, request_id: str, feedback: str, at: float) -> None:
        """Raises UnknownRequest; a later feedback replaces an earlier one."""

    @abstractmethod
    def prune(self, retention: Retention, now: float | None = None) -> int:
        """Delete the requests `retention` does not keep (older than its days before `now`, default
        the current time; beyond its newest rows), with what is tied to them; returns how many."""

    @abstractmethod
    def delete_requests(self, request_ids: Sequence[str]) -> int:
        """Delete these requests, with what is tied to them; unknown ids are skipped. Returns how
        many were deleted."""

    @abstractmethod
    def tools(self, fingerprint: str) -> list[dict]:
        """The tool library stored under this fingerprint; raises StoreError if unknown."""

    @abstractmethod
    def save_labels(self, labels: Sequence[Label]) -> None:
        """Insert or replace mining labels (one per request)."""

    @abstractmethod
    def iter_labels(self, query: Query = Query()) -> Iterator[tuple[StoredRequest, Label]]:
        """Labelled requests matching `query` (its `unlabelled_only` is ignored), oldest first."""

    @abstractmethod
    def stats(self) -> StoreStats: ...

    @abstractmethod
    def schema_version(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "TrafficStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
