"""`hyfunc bench isolation`: how much a new, large tool library delays the requests that do not need it.

Against a running `hyfunc serve`: first `--requests` small requests one after the other (the tools
and requests of a seeded fc-train sample, as `bench serve` sends them), their latency the service
time alone; then the same requests again while one client sends a library of `--tools` tools
sampled from the bundled Seal-Tools library (new to the server: the sample's seed is the time
unless given), honouring each 429's Retry-After (waiting at most `--poll` seconds) until it is
answered. Reported: the small requests' latencies alone and meanwhile, each one's delay (its
latency meanwhile minus the same request's alone) in units of the mean request alone (the target: at
most one), and when the large library was answered and after how many 429s. With `--library-jobs 0` on the server, the library
is embedded on the request path instead: the same command shows what that costs the others.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from hyfunc.serving.bench import workload


def library_tools(n: int, seed: int) -> list[dict]:
    from hyfunc.data import TOOL_LIBRARY

    rows = [json.loads(line) for line in TOOL_LIBRARY.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"type": "function", "function": row} for row in random.Random(seed).sample(rows, n)]


def _small(client: httpx.Client, url: str, model: str, tools: list[dict], query: str, timeout: float) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": query}], "tools": tools}
    start = time.perf_counter()
    response = client.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
    return {"status": response.status_code, "seconds": time.perf_counter() - start}


def _large(client: httpx.Client, url: str, model: str, tools: list[dict], timeout: float, poll: float, out: dict) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Find the tool to look up a flight's status."}],
            "tools": tools}
    start = time.perf_counter()
    while True:
        sent = time.perf_counter()
        response = client.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
        if response.status_code != 429:
            break
        out["refused_429"] = out.get("refused_429", 0) + 1
        out.setdefault("first_retry_after", int(response.headers.get("retry-after", "1")))
        time.sleep(min(poll, float(response.headers.get("retry-after", "1"))))
    out.update(status=response.status_code, answered_after_s=time.perf_counter() - start,
               last_request_s=time.perf_counter() - sent, error=None if response.status_code == 200 else response.text[:300])


def run(args: argparse.Namespace) -> int:
    small_tools, requests = workload(args.data, args.requests, args.seed)
    queries = [request.query for request in requests]
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    seed = args.library_seed if args.library_seed is not None else int(time.time())
    large_tools = library_tools(args.tools, seed)
    with httpx.Client(headers=headers) as client:
        _small(client, args.url, args.model, small_tools, queries[0], args.timeout)  # warm-up: caches the small library
        alone = [_small(client, args.url, args.model, small_tools, q, args.timeout) for q in queries]
        large: dict[str, Any] = {}
        sender = threading.Thread(target=_large, args=(httpx.Client(headers=headers), args.url, args.model, large_tools,
                                                       args.timeout, args.poll, large))
        sender.start()
        meanwhile = []
        for query in queries:  # the same requests while the library is new; at least until it is answered
            meanwhile.append(_small(client, args.url, args.model, small_tools, query, args.timeout))
        while sender.is_alive():
            meanwhile.append(_small(client, args.url, args.model, small_tools, queries[len(meanwhile) % len(queries)], args.timeout))
        sender.join()
    mean_alone = float(np.mean([r["seconds"] for r in alone]))
    delays = [(r["seconds"] - alone[i % len(alone)]["seconds"]) / mean_alone
              for i, r in enumerate(meanwhile) if r["status"] == 200 and alone[i % len(alone)]["status"] == 200]
    summary = {
        "url": args.url, "small_tools": len(small_tools), "requests": len(queries), "library_tools": args.tools,
        "library_seed": seed, "poll_s": args.poll,
        "alone_mean_s": round(mean_alone, 3),
        "alone_median_s": round(float(np.median([r["seconds"] for r in alone])), 3),
        "meanwhile_median_s": round(float(np.median([r["seconds"] for r in meanwhile if r["status"] == 200] or [np.nan])), 3),
        "meanwhile_max_s": round(max((r["seconds"] for r in meanwhile if r["status"] == 200), default=float("nan")), 3),
        "median_delay_in_service_times": round(float(np.median(delays)) if delays else float("nan"), 3),
        "max_delay_in_service_times": round(max(delays, default=float("nan")), 3),
        "meanwhile_not_200": sum(r["status"] != 200 for r in meanwhile),
        "library": {k: round(v, 3) if isinstance(v, float) else v for k, v in large.items()},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "isolation.json").write_text(json.dumps({"summary": summary, "alone": alone, "meanwhile": meanwhile}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0
