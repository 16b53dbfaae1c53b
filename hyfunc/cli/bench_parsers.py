"""The options of `hyfunc bench` (see parsers.py: handlers are named, not imported)."""
from __future__ import annotations

import argparse
import os

from hyfunc.cli.parsers import BENCHMARKS, PLOTS, _add_data_arg, ablation_spec
from hyfunc.data import TOOL_LIBRARY
from hyfunc.models.engines import DEFAULT_ENGINE, ENGINES
from hyfunc.models.registry import DEFAULT_LARGE


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="latency benchmarks")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True)
    lib = bench_sub.add_parser("library", help="fixed tool library (server case): cascade vs direct, both with a KV cache")
    _add_data_arg(lib, "fc-train files or directories (held-out examples are used)")
    lib.add_argument("--requests", type=int, default=12, help="held-out examples; their tools form the library")
    lib.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    lib.add_argument(
        "--with-direct", nargs="+", metavar="MODEL[@ENGINE]",
        help="models answering directly, each with its prefix cache (default: the cascade's large model on --engine)",
    )
    lib.add_argument(
        "--ablations", nargs="+", default=[], type=ablation_spec, metavar="STAGE[+STAGE]",
        help="also run the cascade with these stages off, one variant each (sharing its large-model pass)",
    )
    lib.add_argument("--device", default=None)
    lib.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="engine of the cascade's models")
    lib.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    lib.add_argument("--seed", type=int, default=0)
    lib.add_argument("--out", default="reports/library", help="where library.{json,md,png} go")
    lib.set_defaults(handler=f"{BENCHMARKS}:cmd_bench_library", needs=PLOTS)

    ret = bench_sub.add_parser("retriever", help="recall@k and search latency of the retriever over a whole tool library")
    ret.add_argument(
        "--library", default=str(TOOL_LIBRARY),
        help="JSON Lines of tool schemas, or a directory of them (default: the bundled Seal-Tools library)",
    )
    _add_data_arg(ret, "fc-train files or directories; held-out requests whose tools are in the library")
    ret.add_argument("--limit", type=int, default=None, help="at most N requests")
    ret.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    ret.add_argument("--device", default=None)
    ret.add_argument("--out", default="reports/retrieval", help="where retrieval.{json,md,png} go")
    ret.set_defaults(handler=f"{BENCHMARKS}:cmd_bench_retriever", needs=PLOTS)

    small = bench_sub.add_parser(
        "small-retrieval", help="the small path's tool selector (MiniLM + BM25) vs the cascade's retriever, recall@k")
    _add_data_arg(small, "fc-train files or directories (the validation split is used)")
    small.add_argument("--selector", default=None, help="selector directory (`hyfunc odia selector`; default: the shipped one)")
    small.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    small.add_argument("--limit", type=int, default=None, help="at most N held-out requests with tools (plus their refusal examples)")
    small.add_argument("--no-identity", action="store_true", help="leave out the untrained MiniLM cosine (identity projections)")
    small.add_argument("--device", default=None)
    small.add_argument("--engine", default="transformers", help="engine of the cascade's large model")
    small.add_argument("--out", default="reports/small-retrieval", help="where small_retrieval.{json,md} go")
    small.set_defaults(handler=f"{BENCHMARKS}:cmd_bench_small_retrieval", needs=PLOTS)

    _add_bench_odia_parser(bench_sub)

    refusal = bench_sub.add_parser("refusal", help="the off-topic gate: small talk refused vs calls kept, with and without it")
    _add_data_arg(refusal, "fc-train files or directories (the validation split is used)")
    refusal.add_argument("--artifact", default=None, help="cascade directory with an off-topic gate (default: the shipped one)")
    refusal.add_argument("--calls", type=int, default=60, help="held-out fc-train call requests")
    refusal.add_argument("--library-requests", type=int, default=10, help="requests of the fixed-library set (as bench library)")
    refusal.add_argument("--device", default=None)
    refusal.add_argument("--engine", default="auto", help="engine of the cascade's models")
    refusal.add_argument("--seed", type=int, default=0)
    refusal.add_argument("--out", default="reports/refusal", help="where refusal.{json,md,png} go")
    refusal.set_defaults(handler=f"{BENCHMARKS}:cmd_bench_refusal", needs=PLOTS)

    serve = bench_sub.add_parser("serve", help="load test of `hyfunc serve` servers and llama-server (concurrency 1/4/16)")
    serve.add_argument("--url", nargs="+", help="running servers to compare, e.g. the cascade and direct prompting")
    serve.add_argument("--llama-server", metavar="BINARY",
                       help="also start llama.cpp's llama-server (`make llama-server`; a path or a name on PATH) on "
                            "--llama-server-model's GGUF and measure it the same way")
    serve.add_argument("--llama-server-model", default=DEFAULT_LARGE, help=f"its model alias or .gguf (default {DEFAULT_LARGE})")
    serve.add_argument("--llama-server-slots", type=int, nargs="+", default=[1, 4],
                       help="its parallel slots (-np), one run each (default 1 4)")
    serve.add_argument("--llama-server-context", type=int, default=8192, help="context tokens per slot")
    serve.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's threads")
    _add_data_arg(serve, "fc-train files or directories: tools, requests and their answers")
    serve.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    serve.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    serve.add_argument("--warmup", type=int, default=4, help="concurrent requests sent first, not measured (default 4)")
    serve.add_argument("--model", default="hyfunc", help="model id sent")
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--max-tokens", type=int, default=512, help="max_tokens sent with each request")
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--out", default="reports/serve", help="where serve.{json,md} go")
    serve.set_defaults(handler="hyfunc.serving.bench:run", needs=(("openai", "test"),))

    isolation = bench_sub.add_parser("isolation", help="how much a new large tool library delays a running server's other requests")
    isolation.add_argument("--url", required=True, help="a running `hyfunc serve`")
    _add_data_arg(isolation, "fc-train files or directories: the small requests and their tools")
    isolation.add_argument("--requests", type=int, default=8, help="small requests, alone and again meanwhile")
    isolation.add_argument("--tools", type=int, default=300, help="tools of the new library (from the bundled Seal-Tools library)")
    isolation.add_argument("--library-seed", type=int, default=None, help="its sample (default: the time, so it is new)")
    isolation.add_argument("--poll", type=float, default=2.0, help="most seconds to wait after a 429, whatever its Retry-After")
    isolation.add_argument("--model", default="hyfunc", help="model id sent")
    isolation.add_argument("--api-key", default=None)
    isolation.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    isolation.add_argument("--seed", type=int, default=0)
    isolation.add_argument("--out", default="reports/isolation", help="where isolation.json goes")
    isolation.set_defaults(handler="hyfunc.serving.bench_isolation:run", needs=(("httpx", "serve"),))

    agent = bench_sub.add_parser("agent", help="agent loops (calls, tool results, a text answer) through running servers")
    agent.add_argument("--url", nargs="+", required=True, help="servers to compare, run one after the other on the same tasks")
    agent.add_argument("--model", default="hyfunc", help="model id sent")
    agent.add_argument("--api-key", default=None)
    agent.add_argument("--tasks", type=int, default=None, metavar="N", help="only the first N tasks (default: all)")
    agent.add_argument("--label", nargs="+", default=None, metavar="NAME", help="a name per --url for the report")
    agent.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    agent.add_argument("--out", default="reports/agent-loop", help="where agent.{json,md,png} go")
    agent.set_defaults(handler="hyfunc.eval.agent_bench:run", needs=(("openai", "test"), *PLOTS))


def _add_bench_odia_parser(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser("odia", help="learning from traffic, simulated: share, agreement, accuracy, latency over cycles")
    _add_data_arg(parser, "fc-train files or directories (never BFCL)")
    parser.add_argument("--library", default=None, help="one fixed tool library for every request (JSON Lines); default: own tools")
    parser.add_argument("--artifact", default=None, help="the cascade (default: the shipped one)")
    parser.add_argument("--selector", default=None, help="the small path's tool selector (default: the shipped one)")
    parser.add_argument("--engine", default="transformers", help="engine of every served model")
    parser.add_argument("--with-direct", nargs="*", default=None, metavar="MODEL[@ENGINE]",
                        help="large models answering directly, measured on the same requests (default: the cascade's large model)")
    parser.add_argument("--stream", type=int, default=600, help="requests served in all")
    parser.add_argument("--cycle-every", type=int, default=150, help="a cycle after this many served requests")
    parser.add_argument("--held-out", type=int, default=100, help="held-out requests measured after each cycle")
    parser.add_argument("--explore", type=float, default=0.1, help="share of small-path decisions served by the cascade anyway")
    parser.add_argument("--target", type=float, default=0.99, help="the router's agreement target")
    parser.add_argument("--small-first", action="store_true",
                        help="routers that read the small path's answer: every request runs the small path first")
    parser.add_argument("--min-requests", type=int, default=100, help="a cycle needs this many large-path requests")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-items", type=int, default=None, help="distil on at most N teacher answers per cycle")
    parser.add_argument("--distil-on", choices=("all", "agreed", "none"), default="all",
                        help="teacher answers to distil: all, those the current small path already reproduces, "
                            "or none (keep the small model, retrain the router)")
    parser.add_argument("--labelled", type=int, default=0, metavar="N",
                        help="each cycle's gate also scores the small path against gold on N fc-train validation requests")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/odia", help="where odia_bench.{json,md,png}, the log and the versions go")
    parser.set_defaults(handler=f"{BENCHMARKS}:cmd_bench_odia", needs=PLOTS)
