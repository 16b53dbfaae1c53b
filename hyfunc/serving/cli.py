"""`hyfunc serve`: the OpenAI-compatible server on uvicorn."""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyfunc.routing.store import Retention


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    from hyfunc.methods import ABLATABLE, METHODS
    from hyfunc.methods.direct import PROMPT_STYLES
    from hyfunc.models.engines import DEFAULT_ENGINE, ENGINES
    from hyfunc.models.registry import DEFAULT_LARGE

    serve = subparsers.add_parser(
        "serve", help="OpenAI-compatible server: POST /v1/chat/completions with tools -> tool_calls",
        description="Serve Chat Completions with tools. Decoding is greedy: temperature and top_p are accepted and ignored.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--method", default="hyfunc", choices=METHODS, help="answering method (default: the cascade)")
    serve.add_argument("--artifact", help="cascade directory made by `hyfunc prepare` (default: the shipped one)")
    serve.add_argument(
        "--ablate", nargs="+", default=[], choices=ABLATABLE,
        help="switch cascade stages off; on a CPU without AMX, `large_values large_choices large_numbers` trades "
        "some accuracy for speed (reports/cpu-llamacpp/library-ablation)",
    )
    serve.add_argument("--model", default=DEFAULT_LARGE, help="model of method direct: alias, local path or Hugging Face id")
    serve.add_argument("--style", default="auto", choices=["auto", *PROMPT_STYLES], help="prompting style (method direct)")
    serve.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    serve.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help=f"inference engine (default: {DEFAULT_ENGINE})")
    serve.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    serve.add_argument("--served-model-name", default="hyfunc", help="the model id clients send (default: hyfunc)")
    serve.add_argument(
        "--api-key", default=os.environ.get("HYFUNC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 (default: $HYFUNC_API_KEY; none: no key)",
    )
    serve.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond the running one; then 429")
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    serve.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request, queue included; then 504")
    serve.add_argument("--max-tokens", type=int, default=2048, help="cap on a text reply's max_tokens")
    serve.add_argument(
        "--max-tools", type=int, default=10_000,
        help="most tools per request; more get 400. Over 128 a library is read per function (the cascade "
        "with a library retriever; the first request with it embeds every tool, cached on disk)",
    )
    serve.add_argument(
        "--library-cache", type=int, default=8,
        help="tool libraries whose large-model state (KV cache, embeddings) the cascade keeps, LRU (0: off)",
    )
    serve.add_argument("--library-cache-mb", type=int, default=2048, help="memory bound of that cache")
    from hyfunc.routing.recording import TRAFFIC_HELP

    serve.add_argument("--traffic", nargs="?", const="", default=None, metavar="URL", help=TRAFFIC_HELP)
    serve.add_argument("--traffic-keep-days", type=float, default=None, metavar="DAYS",
                       help="with --traffic: delete logged requests older than DAYS days, at start and then every "
                       "5 minutes (default: keep everything)")
    serve.add_argument("--traffic-keep-rows", type=int, default=None, metavar="N",
                       help="with --traffic: keep only the newest N logged requests, pruned at start and then every "
                       "5 minutes (default: keep everything)")
    serve.add_argument(
        "--router", metavar="DIR",
        help="route each request to the small path or the cascade (method hyfunc): a versions directory of "
        "`hyfunc odia cycle --out` (its champion, promotions picked up live) or one version",
    )
    serve.add_argument(
        "--explore", type=float, default=0.05,
        help="with --router: share of the requests routed to the small path answered by the cascade anyway, so that "
        "the traffic log keeps the large path's answers for the next cycles (default 0.05)",
    )
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)
    return serve


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def traffic_retention(args: argparse.Namespace) -> Retention:
    """The `Retention` of --traffic-keep-days/--traffic-keep-rows; InputError for nonsense."""
    from hyfunc.errors import InputError
    from hyfunc.routing.store import Retention

    retention = Retention(args.traffic_keep_days, args.traffic_keep_rows)
    if args.traffic is None and not retention.unlimited:
        raise InputError("--traffic-keep-days and --traffic-keep-rows limit the traffic log: they need --traffic")
    return retention


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hyfunc.serving import ServeConfig, create_app

    if not _loopback(args.host) and not args.api_key:
        print(f"warning: listening on {args.host} without an API key; anyone who can reach it can use the models",
              file=sys.stderr)
    if args.ablate and args.method != "hyfunc":
        print("error: --ablate applies to --method hyfunc only (direct prompting has no stages to switch off)", file=sys.stderr)
        return 2
    config = ServeConfig(
        served_model=args.served_model_name, api_key=args.api_key, max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes, request_timeout=args.request_timeout, max_tokens_cap=args.max_tokens,
        max_tools=args.max_tools, library_cache=args.library_cache, library_cache_bytes=args.library_cache_mb * 1024**2,
    )

    def load() -> Any:
        from hyfunc.methods import load_method

        start = time.perf_counter()
        # prefix_caching: the direct method reads a fixed tool library once (exact KV reuse).
        method = load_method(
            args.method, model=args.model, style=args.style, device=args.device, prefix_caching=True, artifact=args.artifact,
            ablate=tuple(args.ablate), engine=args.engine, small_engine=args.small_engine,
        )
        print(f"loaded {method.name} in {time.perf_counter() - start:.1f}s; serving as {args.served_model_name!r}",
              file=sys.stderr)
        return method

    # Learning from traffic (hyfunc.routing): the log and the router are opt-in.
    from hyfunc.routing.recording import traffic_log
    from hyfunc.routing.store import StoreError

    retention = traffic_retention(args)

    router = None
    if args.router:
        if args.method != "hyfunc":
            print("error: --router routes between the small path and the cascade: it needs --method hyfunc", file=sys.stderr)
            return 2
        from hyfunc.routing.routed import routed_serving

        load, router = routed_serving(load, args.router, device=args.device, explore=args.explore)
    try:
        traffic = traffic_log(args.traffic, retention)
    except StoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    app = create_app(load, config, traffic=traffic, router=router)
    # The models load in the background: /health answers 503 until they are ready.
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=60)
    finally:
        if traffic is not None:
            health = traffic.close()  # writes what the last requests left queued
            print(f"traffic log {traffic.store.url}: {health.written} written, {health.dropped} dropped, "
                  f"{health.lost} lost", file=sys.stderr)
    return 0
