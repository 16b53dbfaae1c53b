"""Logging answers outside the server: the Python API and `hyfunc call`.

    from hyfunc import load_method
    from hyfunc.routing import RecordedMethod, TrafficLog

    log = TrafficLog()                      # embedded SQLite in $HYFUNC_HOME; or TrafficLog("postgresql://...")
    method = RecordedMethod(load_method("hyfunc"), log)
    answer = method.answer(messages, tools) # answered as before, and logged
    answer.details["request_id"]            # the id to give feedback on (log.feedback(id, "good"))
    log.close()                             # writes what is still queued

The server builds its records itself (hyfunc.serving.service); both produce the same
`ServedRequest`, so mining and routing read one kind of log whatever answered.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from hyfunc.formats.calls import call_record
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer
from hyfunc.routing.record import ServedRequest, TrafficSink
from hyfunc.routing.store import Retention
from hyfunc.routing.traffic import TrafficLog


def method_path(method: Any, answer: Answer | None = None) -> str:
    """Which path answered: what the answer says (a routed method knows), else the method's kind."""
    if answer is not None and isinstance(answer.details.get("path"), str):
        return answer.details["path"]
    if isinstance(getattr(method, "path", None), str):
        return method.path
    if hasattr(method, "large") and hasattr(method, "small"):
        return "cascade"
    if hasattr(method, "backend"):
        return "direct"
    return str(getattr(method, "name", "method"))


def method_models(method: Any) -> dict[str, str]:
    models = {"method": str(getattr(method, "name", type(method).__name__))}
    for role in ("large", "small", "backend"):
        backend = getattr(method, role, None)
        if backend is not None and hasattr(backend, "name"):
            models["model" if role == "backend" else role] = str(backend.name)
    return models


def served_request(messages: Sequence[dict], tools: Sequence[Tool], answer: Answer, path: str,
                   models: dict[str, str], started: float) -> ServedRequest:
    return ServedRequest(
        messages=[dict(m) for m in messages],
        tools=[t.to_openai() for t in tools],
        calls=[call_record(c) for c in answer.calls],
        text="" if answer.calls else answer.raw_text,
        path=path,
        models=models,
        timings=dict(answer.timings),
        input_tokens=answer.input_tokens,
        output_tokens=answer.output_tokens,
        injected_tokens=answer.injected_tokens,
        error=answer.error,
        created=started,
    )


class RecordedMethod:
    """A `Method` that answers with `method` and hands every answer to `sink` (a TrafficLog).
    The sink never fails or slows the answer (TrafficLog.record only enqueues); the record's id
    is put in `answer.details["request_id"]`."""

    def __init__(self, method: Any, sink: TrafficSink):
        self.method, self.sink = method, sink
        self.name = getattr(method, "name", "method")

    def __getattr__(self, name: str) -> Any:
        # Everything else (use_library, large, small, backend, config) is the wrapped method's.
        if name in ("method", "sink"):
            raise AttributeError(name)
        return getattr(self.method, name)

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool]) -> Answer:
        started = time.time()
        answer = self.method.answer(messages, tools)
        try:
            record = served_request(messages, tools, answer, method_path(self.method, answer),
                                    method_models(self.method), started)
            answer.details["request_id"] = record.request_id
            self.sink.record(record)
        except Exception as err:  # noqa: BLE001 - logging is best effort; the answer is not lost for it
            answer.details["traffic_error"] = f"{type(err).__name__}: {err}"
        return answer


def traffic_log(flag: str | None, retention: Retention | None = None) -> TrafficLog | None:
    """The log a `--traffic [URL]` flag asks for: None = off, "" (bare flag) = the embedded SQLite
    store, else a path or URL; `retention`: what of it the log's writer keeps. A malformed URL
    raises StoreError now; a database that is down does not (the log opens lazily and counts what
    it cannot write)."""
    if flag is None:
        return None
    return TrafficLog(flag or None, retention=retention)
