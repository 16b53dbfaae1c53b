"""Serving under load: liveness apart from readiness (a real server whose worker is held busy)."""
from __future__ import annotations

import threading
import time

import httpx

from tests.serve_process import running_server
from tests.test_serve_sdk import ASK, TOOLS


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_ready_degrades_while_the_oldest_request_waits_too_long_and_live_stays_up() -> None:
    # One request runs for 3 s (the method waits; it is asked only when tools are given), the next waits behind it.
    with running_server({"method": "direct", "slow": 3, "max_queue": 2, "ready_max_wait": 0.5}) as url:
        assert httpx.get(f"{url}/health/ready").json() == {"status": "ready", "detail": None}
        statuses: list[int] = []

        def send() -> None:
            body = {"model": "hyfunc", "messages": ASK, "tools": TOOLS, "max_tokens": 2}
            statuses.append(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code)

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 2.5
        while (ready := httpx.get(f"{url}/health/ready")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.status_code == 503 and ready.json()["status"] == "degraded", ready.text
        assert "the oldest queued request has waited" in ready.json()["detail"]
        assert httpx.get(f"{url}/health/live").json() == {"status": "live"}
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # as before: loaded and sound
        assert _gauge(url, "hyfunc:queue_oldest_wait_seconds") > 0.5
        for thread in threads:
            thread.join()
        assert statuses == [200, 200]
        assert httpx.get(f"{url}/health/ready").status_code == 200  # the queue drained: ready again
        assert _gauge(url, "hyfunc:queue_oldest_wait_seconds") == 0.0
