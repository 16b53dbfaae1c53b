"""A separate writer process for the store tests: `python -m tests.traffic_writer URL MODE N PREFIX`.

MODE `log`: N requests through a TrafficLog (the server's way), then close; prints its health.
MODE `batches`: endless batches of 20 written straight to the store, printing the running count
after each commit, so that the parent knows what was acknowledged before it kills this process.
"""
from __future__ import annotations

import json
import sys

from hyfunc.routing.record import ServedRequest
from hyfunc.routing.store import encode
from hyfunc.routing.stores import open_store
from hyfunc.routing.traffic import TrafficLog

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def request(prefix: str, i: int) -> ServedRequest:
    return ServedRequest(
        messages=[{"role": "user", "content": f"weather in city {i}?"}], tools=TOOLS,
        calls=[{"name": "get_weather", "arguments": {"city": f"c{i}"}}], path="cascade",
        timings={"large": 0.1, "small": 0.05}, request_id=f"{prefix}-{i}", created=1_700_000_000 + i,
    )


def main(url: str, mode: str, n: int, prefix: str) -> None:
    if mode == "log":
        log = TrafficLog(url, batch_size=16, flush_interval=0.01)
        for i in range(n):
            log.record(request(prefix, i))
        health = log.close(timeout=60)
        print(json.dumps({"written": health.written, "dropped": health.dropped, "lost": health.lost}), flush=True)
    elif mode == "batches":
        store = open_store(url)
        i = 0
        while True:
            store.write([encode(request(prefix, i + k)) for k in range(20)])
            i += 20
            print(i, flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
