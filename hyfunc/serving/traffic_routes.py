"""The server's side of the traffic log: `POST /v1/feedback` and the log's health counters.

Kept out of app.py: the app calls `add_traffic_routes` once; nothing here touches answering.

- ``POST /v1/feedback`` ``{"request_id": "<the x-request-id of an answer>", "feedback": "good" | "bad"}``
  -> 200 ``{"request_id", "feedback"}``; 404 ``unknown_request_id``; 400 for a bad body;
  503 when the store cannot be reached. Only when the server logs traffic (`--traffic`).
- `/health` gains ``"traffic": {written, dropped, rejected, lost, pending, write_errors, pruned, ...}``
  and `/metrics` the same counts as ``hyfunc:traffic_log_*`` (a collector reads them when
  scraped, so the numbers are never stale and nothing is counted twice).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Any, Callable, Iterator, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, ValidationError

from hyfunc.routing.store import StoreError, StoreUnavailable, UnknownRequest
from hyfunc.serving.errors import APIError, bad_request, from_validation
from hyfunc.serving.protocol import ErrorResponse


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str
    feedback: Literal["good", "bad"]


def traffic_health(traffic: Any) -> dict[str, Any] | None:
    """The log's counters for /health, or None when the sink reports none."""
    health = getattr(traffic, "health", None)
    if health is None:
        return None
    counts = asdict(health())
    counts["ok"] = health().ok
    return counts


class _TrafficCollector:
    """Prometheus collector over `TrafficLog.health()`."""

    COUNTERS = ("accepted", "written", "dropped", "rejected", "lost", "write_errors", "pruned")

    def __init__(self, traffic: Any):
        self.traffic = traffic

    def collect(self) -> Iterator[Any]:
        health = self.traffic.health()
        for name in self.COUNTERS:
            yield CounterMetricFamily(f"hyfunc:traffic_log_{name}", f"Served requests the traffic log {name.replace('_', ' ')}",
                                      value=getattr(health, name))
        yield GaugeMetricFamily("hyfunc:traffic_log_pending", "Served requests accepted, not yet written",
                                value=health.pending)


def add_traffic_routes(app: FastAPI, traffic: Any, registry: CollectorRegistry,
                       authorize: Callable[[Request], None]) -> None:
    """Register the feedback route (if the sink takes feedback) and the metrics collector (if it
    reports health). `authorize` raises APIError 401 like the other /v1 routes."""
    if traffic is not None and hasattr(traffic, "health"):
        registry.register(_TrafficCollector(traffic))
    if traffic is None or not hasattr(traffic, "feedback"):
        return

    errors = {status: {"model": ErrorResponse} for status in (400, 401, 404, 503)}

    @app.post("/v1/feedback", responses=errors, openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": FeedbackRequest.model_json_schema()}}}})
    async def feedback(request: Request) -> JSONResponse:
        authorize(request)
        body = await request.body()
        try:
            data = json.loads(body.decode("utf-8")) if body.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise bad_request(f"the request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise bad_request('expected a JSON object {"request_id": ..., "feedback": "good" | "bad"}', code="invalid_json")
        try:
            parsed = FeedbackRequest.model_validate(data)
        except ValidationError as err:
            raise from_validation(err) from None
        try:
            # The store is a database: its round trip (and a flush of the queue) stays off the event loop.
            await asyncio.to_thread(traffic.feedback, parsed.request_id, parsed.feedback)
        except UnknownRequest:
            raise APIError(404, f"no logged answer has id {parsed.request_id!r}", param="request_id",
                           code="unknown_request_id") from None
        except StoreUnavailable as err:
            raise APIError(503, f"the traffic log cannot be reached: {err}", code="traffic_log_unavailable",
                           headers={"Retry-After": "5"}) from None
        except StoreError as err:
            raise bad_request(str(err), param="feedback") from None
        return JSONResponse({"request_id": parsed.request_id, "feedback": parsed.feedback})
