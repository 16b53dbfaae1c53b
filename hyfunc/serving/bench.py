"""`hyfunc bench serve`: a bounded load test of running servers on loopback, through the openai SDK.

A fixed tool library (the tools of a seeded sample of fc-train examples, deduplicated by name) and
those examples' requests are sent, streamed, at each concurrency level to each server given
(e.g. the cascade on one port, direct prompting with the large model on another), and optionally
to llama.cpp's own `llama-server` started here on the same GGUF (`--llama-server`: the direct
baseline at the API level). Measured per (server, concurrency): requests per minute, latency
p50/p90/p99, time to the first streamed delta (content or call) and to the first argument fragment
(calls stream as the decoder writes them), exact calls (name and arguments equal to the example's
answer), replies whose calls came back as text instead of `tool_calls`, errors and 429s. Every
server gets `--warmup` concurrent warm-up requests first, so the tool library is cached on both sides. Bounded:
`--requests` per level, a time limit per request.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import openai

from hyfunc.errors import InputError
from hyfunc.formats.calls import Call, CallParseError, parse_calls, same_calls


@dataclass
class Result:
    status: int
    latency: float
    ttft: float | None  # first content or tool-call delta
    error: str | None = None
    first_argument: float | None = None  # first non-empty argument fragment
    exact: bool = False  # the calls equal the example's answer
    calls_as_text: bool = False  # no tool_calls, but the text reads as calls


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
            "requests_per_min": round(60 * len(ok) / self.wall, 2) if self.wall else 0.0,
            "exact_calls": sum(r.exact for r in ok), "calls_as_text": sum(r.calls_as_text for r in ok),
            "p50_s": round(float(np.percentile(lat, 50)), 3), "p90_s": round(float(np.percentile(lat, 90)), 3),
            "p99_s": round(float(np.percentile(lat, 99)), 3), "ttft_p50_s": round(float(np.percentile(ttft, 50)), 3),
            "first_argument_p50_s": round(float(np.percentile(first_argument, 50)), 3),
            "first_argument_over_p50": round(float(np.percentile(first_argument, 50)) / p50, 3) if p50 else float("nan"),
        }


@dataclass
class Request:
    query: str
    answers: list[Call]


def sample_rows(data: list[str], requests: int, seed: int) -> list[dict]:
    """A seeded sample of fc-train rows from JSON Lines files or directories of them."""
    rows: list[dict] = []
    for source in data:
        path = Path(source)
        for file in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
            rows += [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return random.Random(seed).sample(rows, min(requests, len(rows)))


def workload(data: list[str], requests: int, seed: int) -> tuple[list[dict], list[Request]]:
    """(OpenAI tools, requests with their answers) from fc-train JSON Lines files or directories of them."""
    sample = sample_rows(data, requests, seed)
    tools: dict[str, dict] = {}
    for row in sample:
        for tool in row["tools"]:
            tools.setdefault(tool["name"], {"type": "function", "function": tool})
    return list(tools.values()), [Request(row["query"], [Call(a["name"], a.get("arguments") or {}) for a in row["answers"]])
                                  for row in sample]


def _calls(fragments: dict[int, dict[str, str]]) -> list[Call] | None:
    """The streamed tool calls, assembled by index; None when an argument string is not a JSON object."""
    calls = []
    for index in sorted(fragments):
        try:
            arguments = json.loads(fragments[index]["arguments"] or "{}")
        except json.JSONDecodeError:
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append(Call(fragments[index]["name"], arguments))
    return calls


def _reads_as_calls(text: str) -> bool:
    try:
        return bool(text.strip()) and bool(parse_calls(text))
    except CallParseError:
        return False


async def _one(client: openai.AsyncOpenAI, model: str, tools: list[dict], request: Request, max_tokens: int) -> Result:
    start = time.perf_counter()
    ttft = first_argument = None
    fragments: dict[int, dict[str, str]] = {}
    text = ""
    stream = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": request.query}], tools=tools, stream=True,
            max_tokens=max_tokens)
        async for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            if ttft is None and (delta.content or delta.tool_calls):
                ttft = time.perf_counter() - start
            text += delta.content or ""
            for part in delta.tool_calls or []:
                entry = fragments.setdefault(part.index, {"name": "", "arguments": ""})
                if part.function and part.function.name:
                    entry["name"] += part.function.name
                if part.function and part.function.arguments:
                    entry["arguments"] += part.function.arguments
                    if first_argument is None:
                        first_argument = time.perf_counter() - start
    except openai.APIStatusError as err:
        return Result(err.status_code, time.perf_counter() - start, None, error=None if err.status_code == 429 else str(err)[:200])
    except openai.APIError as err:  # connection, timeout, or an error event in a stream already answered 200
        return Result(0 if stream is None else 200, time.perf_counter() - start, ttft, error=f"{type(err).__name__}: {err}"[:200])
    calls = _calls(fragments)
    return Result(200, time.perf_counter() - start, ttft, first_argument=first_argument,
                  exact=calls is not None and bool(fragments or not request.answers) and same_calls(calls, request.answers),
                  calls_as_text=not fragments and _reads_as_calls(text))


async def _level(url: str, args: argparse.Namespace, tools: list[dict], requests: list[Request], concurrency: int) -> Level:
    level = Level(url, concurrency)
    pending = list(requests)
    # No retries: a 429 is counted, not hidden.
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=args.api_key or "none", timeout=args.timeout,
                                  max_retries=0) as client:
        async def user() -> None:
            while pending:
                level.results.append(await _one(client, args.model, tools, pending.pop(), args.max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        level.wall = time.perf_counter() - start
    return level


def _servers(args: argparse.Namespace, out: Path) -> Iterator[tuple[str, AbstractContextManager[str]]]:
    """(label, a context giving its URL) of every server to measure: the running ones given, then
    `llama-server` started here once per slot count (one at a time: each measured alone)."""
    for url in args.url or []:
        yield url, nullcontext(url)
    if args.llama_server:
        from hyfunc.models.registry import resolve_gguf
        from hyfunc.serving.llama_server import find_binary, llama_server

        binary, gguf = find_binary(args.llama_server), resolve_gguf(args.llama_server_model)
        for slots in args.llama_server_slots:
            yield (f"llama-server {args.llama_server_model} -np {slots}",
                   llama_server(binary, gguf, slots=slots, context_per_slot=args.llama_server_context,
                                threads=args.threads, log=out / f"llama-server-np{slots}.log"))


def run(args: argparse.Namespace) -> int:
    if not args.url and not args.llama_server:
        raise InputError("bench serve measures running servers (--url) and/or llama-server (--llama-server): give one")
    tools, requests = workload(args.data, args.requests, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels: list[Level] = []
    for label, server in _servers(args, out):
        with server as url:
            # Warm-up: loads lazy tables and caches the tool library, as a long-running server would have
            # (`--warmup` at once: every parallel slot of a llama-server reads it once).
            asyncio.run(_level(url, args, tools, requests[:args.warmup], args.warmup))
            for concurrency in args.concurrency:
                level = asyncio.run(_level(url, args, tools, requests, concurrency))
                level.server = label
                levels.append(level)
                print(json.dumps(level.summary()), flush=True)
    summaries = [level.summary() for level in levels]
    from hyfunc.eval.provenance import provenance  # imports torch: only once the load is over

    (out / "serve.json").write_text(json.dumps({
        "command": "hyfunc " + " ".join(sys.argv[1:]), "provenance": provenance(),
        "tools": len(tools), "requests": len(requests), "summaries": summaries,
        "results": [[asdict(r) for r in level.results] for level in levels],
    }, indent=1))
    columns = list(summaries[0]) if summaries else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(s[c]) for c in columns) + " |" for s in summaries]
    (out / "serve.md").write_text(f"# hyfunc bench serve\n\n{len(tools)} tools, {len(requests)} requests per level, "
                                  "streamed; latency of 200s only; exact calls: name and arguments equal to the "
                                  "example's answer.\n\n" + "\n".join(lines) + "\n")
    print((out / "serve.md").read_text())
    return 0
