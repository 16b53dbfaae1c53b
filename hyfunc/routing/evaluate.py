"""Replay held-out logged traffic through a routed system, for the gate: how much goes to the
small path, how often the answer equals the large path's, and what latency that implies.

Latency is replayed, not re-measured: a request routed to the small path costs the router plus
the small path's measured time; one left to the large path costs the router plus what the log
says the large path took (its per-stage timings), since that is what serving it costs today.
A small-first router (one that reads the small path's answer) runs the small path on every
request: an escalated request costs the small path's time plus the large path's.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from hyfunc.cascade.data import Example
from hyfunc.errors import InputError
from hyfunc.formats.calls import calls_from_records, same_calls
from hyfunc.routing.mining import SmallOutput, SmallPath
from hyfunc.routing.store import LARGE_PATHS, Query, TrafficStore
from hyfunc.routing.versions import Metrics

# (messages, tools, the small path's answer when the router reads it) -> "small" | "large"
RouteFn = Callable[[list[dict], list[dict], SmallOutput | None], str]


def replay(store: TrafficStore, route: RouteFn, small_path: SmallPath, query: Query,
           gold: Mapping[str, list[dict]] | None = None, small_first: bool = False) -> Metrics:
    """`gold`: request id -> correct calls for a labelled holdout (accuracy is reported only then);
    `small_first`: the router reads the small path's answer, so the small path runs first."""
    n = agree = small = correct = scored = 0
    latency = 0.0
    selection = Query(query.since, query.until, LARGE_PATHS if query.paths is None else query.paths,
                      query.library, True, False, query.limit)
    for stored in store.iter_requests(selection):
        req = stored.request
        messages, tools = [dict(m) for m in req.messages], [dict(t) for t in req.tools]
        started = time.perf_counter()
        tried = small_path(messages, tools) if small_first else None
        decision = route(messages, tools, tried)
        if decision == "small":
            answer = (tried if tried is not None else small_path(messages, tools)).calls
            latency += time.perf_counter() - started
            small += 1
        else:
            answer = req.calls
            latency += time.perf_counter() - started + sum(req.timings.values())
        n += 1
        agree += same_calls(calls_from_records(answer), calls_from_records(req.calls))
        if gold is not None and req.request_id in gold:
            scored += 1
            correct += same_calls(calls_from_records(answer), calls_from_records(gold[req.request_id]))
    if n == 0:
        raise InputError("no held-out large-path traffic to evaluate on")
    return Metrics(agreement=agree / n, share=small / n, mean_latency=latency / n,
                   accuracy=correct / scored if scored else None)


def replay_router(store: TrafficStore, router: Any, small_path: SmallPath, query: Query,
                  gold: Mapping[str, list[dict]] | None = None) -> Metrics:
    """`replay` with a Router's decisions; small-first when the router reads the small path's
    answer, whose decode then stops below the router's confidence floor, as served."""

    def route(messages: list[dict], tools: list[dict], tried: SmallOutput | None) -> str:
        if tried is None:
            return router.route(messages, tools)
        return router.route(messages, tools, tried.calls, tried.confidence, tried.gave_up, tried.near_fit)

    def first(messages: list[dict], tools: list[dict]) -> SmallOutput:
        return small_path(messages, tools, give_up_below=router.confidence_floor(messages, tools))

    if not router.needs_small_answer:
        return replay(store, route, small_path, query, gold)
    return replay(store, route, first, query, gold, small_first=True)


def small_path_accuracy(small_path: SmallPath, examples: Sequence[Example]) -> float:
    """The small path alone against gold (`same_calls`) on labelled requests, e.g. `labelled_examples`."""
    if not examples:
        raise InputError("no labelled examples to score the small path on")
    correct = 0
    for ex in examples:
        tools = [t.to_openai() for t in ex.tools]
        answer = small_path([{"role": "user", "content": ex.query}], tools)
        correct += same_calls(calls_from_records(answer.calls), ex.answers)
    return correct / len(examples)
