"""The command lines of the learning-from-traffic benchmarks: `hyfunc bench small-retrieval` and
`hyfunc bench odia`. Parsers only; the benchmarks import on use (`hyfunc --help` stays fast)."""
from __future__ import annotations

from typing import Any


def add_small_retrieval_parser(bench_sub: Any) -> None:
    parser = bench_sub.add_parser(
        "small-retrieval", help="the small path's tool selector (MiniLM + BM25) vs the cascade's retriever, recall@k")
    parser.add_argument("--data", nargs="+", required=True, help="fc-train files or directories (the validation split is used)")
    parser.add_argument("--selector", default=None, help="selector directory (`hyfunc odia selector`; default: the shipped one)")
    parser.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    parser.add_argument("--limit", type=int, default=None, help="at most N held-out requests with tools (plus their refusal examples)")
    parser.add_argument("--no-identity", action="store_true", help="leave out the untrained MiniLM cosine (identity projections)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--engine", default="transformers", help="engine of the cascade's large model")
    parser.add_argument("--out", default="reports/small-retrieval", help="where small_retrieval.{json,md} go")
    parser.set_defaults(func=cmd_small_retrieval)


def cmd_small_retrieval(args: Any) -> int:
    from hyfunc.cascade.selector import (
        ToolSelector,
        default_selector_dir,
        identity_selector,
    )
    from hyfunc.eval.small_retrieval import (
        Ranker,
        cascade_ranker,
        held_out_requests,
        run_small_retrieval,
        selector_ranker,
        write_small_retrieval_report,
    )
    from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod
    from hyfunc.models.minilm import MiniLMEmbedder

    requests = held_out_requests(args.data, args.limit)
    cascade = HyFuncMethod.load(args.artifact or DEFAULT_ARTIFACT, device=args.device, large_engine=args.engine,
                                small_engine=args.engine)
    embedder = MiniLMEmbedder()
    rankers: dict[str, Ranker] = {"cascade retriever (large model + BM25)": cascade_ranker(cascade)}
    rankers["small-path selector (MiniLM + BM25)"] = selector_ranker(
        ToolSelector.load(args.selector or default_selector_dir(), embedder))
    if not args.no_identity:
        rankers["MiniLM cosine, untrained, uncalibrated"] = selector_ranker(ToolSelector(identity_selector(), embedder))
    paths = write_small_retrieval_report(run_small_retrieval(rankers, requests), args.out)
    print(paths["md"].read_text())
    return 0


def add_bench_odia_parser(bench_sub: Any) -> None:
    parser = bench_sub.add_parser("odia", help="learning from traffic, simulated: share, agreement, accuracy, latency over cycles")
    parser.add_argument("--data", nargs="+", required=True, help="fc-train files or directories (never BFCL)")
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
    parser.set_defaults(func=cmd_bench_odia)


def cmd_bench_odia(args: Any) -> int:
    from hyfunc.cascade.library import load_library
    from hyfunc.eval.odia_bench import (
        OdiaBenchConfig,
        run_odia_bench,
        write_odia_report,
    )
    from hyfunc.methods import load_method
    from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod
    from hyfunc.routing.cycle import CycleConfig
    from hyfunc.routing.distil import DistilConfig

    artifact = args.artifact or DEFAULT_ARTIFACT
    cascade = HyFuncMethod.load(artifact, device=args.device, large_engine=args.engine, small_engine=args.engine)
    direct = {}
    for spec in [f"{cascade.large.name}@{args.engine}"] if args.with_direct is None else args.with_direct:
        model, _, engine = spec.partition("@")
        engine = engine or args.engine
        same = model == cascade.large.name and engine == cascade.large.engine
        direct[f"direct:{model}@{engine}"] = load_method("direct", model=model, device=args.device, prefix_caching=True,
                                                         backend=cascade.large if same else None, engine=engine)
    cycle = CycleConfig(target=args.target, small_first=args.small_first, min_requests=args.min_requests,
                        replay_data=list(args.data), selector=args.selector, engine=args.engine, device=args.device,
                        distil_on=args.distil_on, labelled=args.labelled,
                        distil=DistilConfig(epochs=args.epochs, lora_rank=args.lora_rank, max_items=args.max_items,
                                            seed=args.seed))
    config = OdiaBenchConfig(stream=args.stream, cycle_every=args.cycle_every, held_out=args.held_out,
                             explore=args.explore, seed=args.seed, cycle=cycle)
    library = load_library(args.library) if args.library else None
    result = run_odia_bench(cascade, artifact, direct, args.data, args.out, config, library)
    paths = write_odia_report(result, args.out)
    print(paths["md"].read_text())
    return 0
