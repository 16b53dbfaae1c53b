"""Prometheus metrics, named in vLLM's style (``vllm:e2e_request_latency_seconds`` ->
``hyfunc:e2e_request_latency_seconds``) so existing dashboards need only a prefix change.

Each app gets its own registry: several apps in one process (tests) do not collide.
"""
from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Seconds: CPU answers take from ~0.1 s (cached library, short call) to minutes (long text replies).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hyfunc:requests", "HTTP responses of the API by status code", ["status"], registry=r)
        self.e2e = Histogram(
            "hyfunc:e2e_request_latency_seconds", "Time from receiving a chat request to its last byte, by answering path",
            ["path"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_time = Histogram(
            "hyfunc:request_queue_time_seconds", "Time a chat request waited for the model worker",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "hyfunc:time_to_first_token_seconds", "Streamed requests: time to the first content or argument delta",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.stage = Histogram(
            "hyfunc:stage_latency_seconds",
            "Per-stage latency (large_prefill, retrieve, small_prefill, small_decode; prefill/decode for direct; "
            "text_reply, forced_prefill, forced_decode, library_build)",
            ["stage"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.prompt_tokens = Counter("hyfunc:prompt_tokens", "Prompt tokens run through the models", registry=r)
        self.cached_tokens = Counter("hyfunc:cached_prompt_tokens", "Prompt tokens served from a reused KV cache", registry=r)
        self.generation_tokens = Counter(
            "hyfunc:generation_tokens", "Output tokens chosen by a model (not injected by templating)", registry=r
        )
        self.injected_tokens = Counter("hyfunc:injected_tokens", "Output tokens injected by the templating decoder", registry=r)
        self.waiting = Gauge("hyfunc:num_requests_waiting", "Chat requests queued for the model worker", registry=r)
        self.running = Gauge("hyfunc:num_requests_running", "Chat requests being answered", registry=r)
        self.oldest_wait = Gauge(
            "hyfunc:queue_oldest_wait_seconds", "Seconds the oldest queued chat request has waited (0: none waits)",
            registry=r,
        )
        self.rejected = Counter("hyfunc:requests_rejected", "Chat requests answered 429 because the queue was full", registry=r)
        self.stopped = Counter(
            "hyfunc:requests_stopped", "Chat requests whose model work stopped midway: the client left or the time limit passed",
            registry=r,
        )
        self.library_hits = Counter("hyfunc:library_cache_hits", "Requests whose tool library state was reused", registry=r)
        self.library_misses = Counter("hyfunc:library_cache_misses", "Requests that built their tool library state", registry=r)
        self.library_entries = Gauge("hyfunc:library_cache_entries", "Tool libraries held in the cache", registry=r)
        self.library_bytes = Gauge("hyfunc:library_cache_bytes", "Tensor bytes held by the tool library cache", registry=r)
        self.library_jobs = Gauge("hyfunc:library_jobs", "New tool libraries being embedded off the request path", registry=r)
        self.library_job_tools = Counter(
            "hyfunc:library_job_tools", "Tools of new libraries embedded off the request path", registry=r
        )
        self.engine_steps = Counter(
            "hyfunc:engine_steps", "Engine calls of batched models (--batch), by model and requests' sequences in the call",
            ["model", "sequences"], registry=r,
        )
        self.traffic_errors = Counter("hyfunc:traffic_sink_errors", "Served requests the traffic log failed to take", registry=r)

    def observe_stages(self, timings: dict[str, float]) -> None:
        for stage, seconds in timings.items():
            self.stage.labels(stage=stage).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
