"""`hyfunc bench serve`: a bounded load test of running servers on loopback.

A fixed tool library (the tools of a seeded sample of fc-train examples, deduplicated by name) and
those examples' requests are sent, streamed, at each concurrency level to each server given
(e.g. the cascade on one port, direct prompting with the large model on another). Measured per
(server, concurrency): throughput, latency p50/p90/p99, time to the first streamed delta (content
or call) and to the first argument fragment (the calls stream as the decoder writes them; the
issue's target is this p50 at most half the full latency's), errors and 429s. Every server gets one warm-up request first, so the tool library is
cached on both sides. Bounded: `--requests` per level, a time limit per request.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np


@dataclass
class Result:
    status: int
    latency: float
    ttft: float | None  # first content or tool-call delta
    error: str | None = None
    first_argument: float | None = None  # first non-empty argument fragment


@dataclass
class Level:
    server: str
    concurrency: int
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.results if r.status == 200 and r.error is None]
        lat = np.array([r.latency for r in ok]) if ok else np.array([np.nan])
        ttft = np.array([r.ttft for r in ok if r.ttft is not None] or [np.nan])
        first_argument = np.array([r.first_argument for r in ok if r.first_argument is not None] or [np.nan])
        p50 = float(np.percentile(lat, 50))
        return {
            "server": self.server, "concurrency": self.concurrency, "requests": len(self.results), "ok": len(ok),
            "rejected_429": sum(r.status == 429 for r in self.results),
            "errors": sum(r.status not in (200, 429) or r.error is not None for r in self.results),
            "throughput_rps": round(len(ok) / self.wall, 3) if self.wall else 0.0,
            "p50_s": round(float(np.percentile(lat, 50)), 3), "p90_s": round(float(np.percentile(lat, 90)), 3),
            "p99_s": round(float(np.percentile(lat, 99)), 3), "ttft_p50_s": round(float(np.percentile(ttft, 50)), 3),
            "first_argument_p50_s": round(float(np.percentile(first_argument, 50)), 3),
            "first_argument_over_p50": round(float(np.percentile(first_argument, 50)) / p50, 3) if p50 else float("nan"),
        }


def workload(data: list[str], requests: int, seed: int) -> tuple[list[dict], list[str]]:
    """(OpenAI tools, request texts) from fc-train JSON Lines files or directories of them."""
    rows: list[dict] = []
    for source in data:
        path = Path(source)
        for file in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
            rows += [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    sample = random.Random(seed).sample(rows, min(requests, len(rows)))
    tools: dict[str, dict] = {}
    for row in sample:
        for tool in row["tools"]:
            tools.setdefault(tool["name"], {"type": "function", "function": tool})
    return list(tools.values()), [row["query"] for row in sample]


def _has_arguments(line: str) -> bool:
    """Whether a chunk line carries a non-empty argument fragment."""
    choices = json.loads(line[6:]).get("choices") or [{}]
    deltas = choices[0].get("delta", {}).get("tool_calls") or []
    return any(d.get("function", {}).get("arguments") for d in deltas)


async def _one(client: httpx.AsyncClient, url: str, body: dict, timeout: float) -> Result:
    start = time.perf_counter()
    ttft = first_argument = None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
                return Result(response.status_code, time.perf_counter() - start, None)
            async for line in response.aiter_lines():
                if ttft is None and line.startswith("data: {") and ('"content"' in line or '"tool_calls"' in line):
                    ttft = time.perf_counter() - start
                if first_argument is None and line.startswith("data: {") and '"tool_calls"' in line and _has_arguments(line):
                    first_argument = time.perf_counter() - start
                if line.startswith("data: {\"error\""):
                    return Result(200, time.perf_counter() - start, ttft, error=line[6:200])
        return Result(200, time.perf_counter() - start, ttft, first_argument=first_argument)
    except httpx.HTTPError as err:
        return Result(0, time.perf_counter() - start, None, error=f"{type(err).__name__}: {err}")


async def _level(url: str, model: str, key: str | None, tools: list[dict], queries: list[str], concurrency: int,
                 timeout: float) -> Level:
    level = Level(url, concurrency)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    pending = list(queries)
    async with httpx.AsyncClient(headers=headers) as client:
        async def user() -> None:
            while pending:
                query = pending.pop()
                body = {"model": model, "messages": [{"role": "user", "content": query}], "tools": tools, "stream": True}
                level.results.append(await _one(client, url, body, timeout))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        level.wall = time.perf_counter() - start
    return level


def run(args: argparse.Namespace) -> int:
    tools, queries = workload(args.data, args.requests, args.seed)
    levels: list[Level] = []
    for url in args.url:
        # Warm-up: loads lazy tables and caches the tool library, as a long-running server would have.
        asyncio.run(_level(url, args.model, args.api_key, tools, queries[:1], 1, args.timeout))
        for concurrency in args.concurrency:
            levels.append(asyncio.run(_level(url, args.model, args.api_key, tools, queries, concurrency, args.timeout)))
            print(json.dumps(levels[-1].summary()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [level.summary() for level in levels]
    (out / "serve.json").write_text(json.dumps({
        "tools": len(tools), "requests": len(queries), "summaries": summaries,
        "results": [[asdict(r) for r in level.results] for level in levels],
    }, indent=1))
    columns = list(summaries[0]) if summaries else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(s[c]) for c in columns) + " |" for s in summaries]
    (out / "serve.md").write_text(f"# hyfunc bench serve\n\n{len(tools)} tools, {len(queries)} requests per level, "
                                  "streamed; latency of 200s only.\n\n" + "\n".join(lines) + "\n")
    print((out / "serve.md").read_text())
    return 0
