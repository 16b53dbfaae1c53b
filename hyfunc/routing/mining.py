"""Mining: label logged requests *simple* when the small path reproduces the large path's answer.

For each request the large path answered (cascade / large / direct, without error), the small
path is run on the same conversation and tools; the request is simple when both produced the same
calls by `hyfunc.formats.calls.same_calls`, the comparison the evaluation uses (both refusing
counts as agreement: the small path would have served that request just as well). The label and
the routing features (features.py) are saved in the store, next to the request. The large path's
answer is the teacher: gold labels are never needed, and never used.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hyfunc.formats.calls import call_record, calls_from_records, same_calls
from hyfunc.formats.messages import conversation_text
from hyfunc.models.minilm import Embedder
from hyfunc.routing.features import scalar_features
from hyfunc.routing.store import LARGE_PATHS, Label, Query, StoredRequest, TrafficStore


@dataclass
class SmallOutput:
    """What the small path answered: calls as [{"name", "arguments"}] ([] = no call), and its own
    confidence in [0, 1] when it reports one (e.g. its lowest value-token probability)."""

    calls: list[dict]
    confidence: float | None = None
    gave_up: bool = False  # stopped below the confidence floor it was given (no calls)
    near_fit: tuple[str, ...] = ()  # offered tools it left out that nearly fit (hyfunc.methods.small)


# (messages, OpenAI tools) -> answer; a method's small path also takes `give_up_below`.
SmallPath = Callable[..., SmallOutput]


def method_small_path(method: Any) -> SmallPath:
    """Adapt a hyfunc `Method` (e.g. the small model with templating) into a SmallPath. Its
    confidence is read from `answer.details["confidence"]` when the method reports one."""
    from hyfunc.formats.schema import parse_tools

    def run(messages: list[dict], tools: list[dict], give_up_below: float = 0.0) -> SmallOutput:
        # Only the small method (SmallMethod) can stop early; any other method is asked as usual.
        answer = (method.answer(messages, parse_tools(tools), give_up_below=give_up_below) if give_up_below
                  else method.answer(messages, parse_tools(tools)))
        details = answer.details if isinstance(answer.details, Mapping) else {}
        confidence = details.get("confidence")
        return SmallOutput([call_record(c) for c in answer.calls], None if confidence is None else float(confidence),
                           bool(details.get("gave_up")), tuple(details.get("near_fit", ())))

    return run


@dataclass
class MiningReport:
    examined: int = 0  # large-path requests considered
    labelled: int = 0
    simple: int = 0
    small_failures: int = 0  # the small path raised: labelled not simple (it could not serve it)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # first few small-path errors, for the user

    @property
    def simple_share(self) -> float:
        return self.simple / self.labelled if self.labelled else 0.0


def label_request(stored: StoredRequest, small: SmallOutput | None, small_path_name: str,
                  error: str | None = None) -> Label:
    """The label of one request given the small path's output (None when it raised)."""
    req = stored.request
    small_calls = [] if small is None else [call_record(c) for c in small.calls]
    simple = small is not None and same_calls(calls_from_records(small_calls), calls_from_records(req.calls))
    # A small path that raised answered nothing, with no confidence: its features say so, so a
    # router reading the small path's answer trains on every request.
    features = scalar_features(req.messages, req.tools, small_calls, 0.0 if small is None else small.confidence)
    features["large_calls"] = float(len(req.calls))  # for analysis; unknown at routing time
    if error is not None:
        features["small_error"] = 1.0
    return Label(request_id=req.request_id, simple=simple, small_calls=small_calls, features=features,
                 small_path=small_path_name, labelled=time.time())


def mine(store: TrafficStore, small_path: SmallPath, *, small_path_name: str,
         embedder: Embedder | None = None, query: Query = Query(), relabel: bool = False,
         batch_size: int = 64, large_paths: Sequence[str] = LARGE_PATHS,
         save: Callable[[list[Label]], None] | None = None) -> MiningReport:
    """Label the large path's logged requests matching `query` (those not labelled yet, unless
    `relabel`: after the small model changed, every label must be recomputed). Labels are
    saved per batch, so an interrupted run keeps its work and a rerun continues. `save`: where
    labels go instead of the store (a cycle labels with a candidate small path, and stores
    those labels only if the candidate is promoted)."""
    started = time.perf_counter()
    report = MiningReport()
    selection = Query(query.since, query.until, tuple(large_paths) if query.paths is None else query.paths,
                      query.library, True, not relabel, query.limit)
    batch: list[StoredRequest] = []

    def flush() -> None:
        labels: list[Label] = []
        for stored in batch:
            req = stored.request
            try:
                small = small_path([dict(m) for m in req.messages], [dict(t) for t in req.tools])
                labels.append(label_request(stored, small, small_path_name))
            except Exception as e:  # a small path that crashes cannot serve the request: not simple
                report.small_failures += 1
                if len(report.failures) < 5:
                    report.failures.append(f"{req.request_id}: {type(e).__name__}: {e}")
                labels.append(label_request(stored, None, small_path_name, error=str(e)))
        if embedder is not None and labels:
            vectors = embedder.embed([conversation_text(s.request.messages) for s in batch])
            for label, vector in zip(labels, vectors):
                label.embedding = [float(x) for x in vector]
                label.embedder = embedder.name
        (save or store.save_labels)(labels)
        report.labelled += len(labels)
        report.simple += sum(l.simple for l in labels)
        batch.clear()

    # Saving labels while paging through an `unlabelled_only` query is safe: pages are keyed on
    # (created, request_id), not offsets, so labelled rows behind the cursor shift nothing.
    for stored in store.iter_requests(selection):
        report.examined += 1
        batch.append(stored)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    report.seconds = time.perf_counter() - started
    return report
