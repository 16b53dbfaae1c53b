"""The `hyfunc` command line."""
from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path

from hyfunc.cascade.manifest import MANIFEST
from hyfunc.cli_checks import (
    CALL_FORMATS,
    check_bfcl_inputs,
    check_loadable,
    split_engine_spec,
    check_method_options,
    format_answer,
    one_line,
)
from hyfunc.config import threads
from hyfunc.errors import InputError, UserError
from hyfunc.formats.bfcl import ALIASES, CATEGORIES, EXTRA_CATEGORIES
from hyfunc.formats.calls import render_python_calls
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.tools_file import read_tools_file
from hyfunc.methods import ABLATABLE, METHODS
from hyfunc.methods.base import Answer
from hyfunc.methods.direct import PROMPT_STYLES
from hyfunc.models.engines import DEFAULT_ENGINE, ENGINES, check_engine, resolve_engine
from hyfunc.models.registry import DEFAULT_LARGE, DEFAULT_SMALL
from hyfunc.progress import steps

#: Errors that are the user's to fix: printed as one line, exit status 2. Anything else is a bug
#: and keeps its traceback. A missing file named on the command line is the user's too.
USER_ERRORS = (UserError, FileNotFoundError)


def _ablation(spec: str) -> str:
    """An `--ablations` item: a stage, or stages joined by '+' (one variant with all of them off)."""
    unknown = [stage for stage in spec.split("+") if stage not in ABLATABLE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown stage {unknown[0]!r}; stages: {', '.join(ABLATABLE)}")
    return spec


def _add_method_args(parser: argparse.ArgumentParser, prefix_caching: bool) -> None:
    parser.add_argument("--method", default="hyfunc", choices=METHODS, help="answering method (default: the cascade)")
    parser.add_argument(
        "--artifact", help="cascade directory made by `hyfunc prepare` (method hyfunc; default: the shipped one)"
    )
    parser.add_argument(
        "--ablate", nargs="+", default=[], choices=ABLATABLE,
        help="switch cascade stages off (method hyfunc)",
    )
    # No defaults here: an option given with a method it does not apply to is refused (cli_checks).
    parser.add_argument(
        "--model", default=None, help=f"alias, local path or Hugging Face id (method direct; default {DEFAULT_LARGE})"
    )
    parser.add_argument("--style", default=None, choices=["auto", *PROMPT_STYLES], help="prompting style (method direct)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument(
        "--engine", default=DEFAULT_ENGINE, choices=ENGINES,
        help="inference engine of every model (default auto: llama.cpp for GGUF models on the CPU, the fastest measured, else transformers)",
    )
    parser.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    parser.add_argument(
        "--router", metavar="DIR",
        help="route each request to the small path or the cascade (method hyfunc): a versions directory of "
        "`hyfunc odia cycle --out` (its champion) or one version",
    )
    parser.add_argument(
        "--prefix-caching", action=argparse.BooleanOptionalAction, default=prefix_caching,
        help="reuse the KV cache of the prompt prefix shared with the previous request (exact)",
    )


def _build_method(args: argparse.Namespace):
    from hyfunc.methods import load_method

    check_method_options(args)
    threads()  # a bad HYFUNC_THREADS fails here, not after seconds of loading behind a progress bar
    if getattr(args, "router", None) and args.method != "hyfunc":
        raise InputError("--router routes between the small path and the cascade: it needs --method hyfunc")
    start = time.perf_counter()
    with steps(f"loading {args.method}", total=1) as progress:
        progress.next("models")
        # A fixed tool library (demo, call) is read once; BFCL cases each bring their own tools.
        method = load_method(
            args.method, model=args.model or DEFAULT_LARGE, style=args.style or "auto", device=args.device,
            prefix_caching=args.prefix_caching, artifact=args.artifact, ablate=tuple(args.ablate),
            engine=args.engine, small_engine=args.small_engine,
        )
    models = [m for m in (getattr(method, "large", None), getattr(method, "small", None), getattr(method, "backend", None)) if m]
    if getattr(args, "router", None):
        from hyfunc.routing.routed import RoutedMethod

        method = RoutedMethod.load(method, args.router, engine=args.engine, device=args.device)
    print(f"loaded {method.name} in {time.perf_counter() - start:.1f}s: " + "; ".join(m.description for m in models), file=sys.stderr)
    return method


def _format_timings(answer: Answer) -> str:
    parts = [f"{name} {seconds * 1000:.0f} ms" for name, seconds in answer.timings.items()]
    cached = f" ({answer.cached_tokens} from cache)" if answer.cached_tokens else ""
    return (
        f"{answer.latency * 1000:.0f} ms ({', '.join(parts)}); "
        f"{answer.input_tokens} tokens in{cached}, {answer.output_tokens} out"
    )


def _print_answer(query: str, answer: Answer) -> None:
    print(f"> {query}")
    if answer.error:
        print(f"  no usable answer: {answer.error}\n  raw: {answer.raw_text!r}")
    elif answer.calls:
        print(f"  {render_python_calls(answer.calls)}")
    else:
        print(f"  no tool fits: {answer.raw_text.strip()!r}")
    print(f"  {_format_timings(answer)}")


def cmd_demo(args: argparse.Namespace) -> int:
    demo = json.loads(resources.files("hyfunc.data").joinpath("demo.json").read_text())
    tools = parse_tools(demo["tools"])
    method = _build_method(args)
    if args.prefix_caching and hasattr(method, "use_library"):
        with steps("reading the tool library", total=1) as progress:
            progress.next(f"{len(tools)} tools")
            method.use_library(tools)  # the cascade's large model reads the fixed library once
    print(f"{len(tools)} tools: {', '.join(t.name for t in tools)}")
    for query in demo["requests"]:
        _print_answer(query, method.answer([{"role": "user", "content": query}], tools))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    tools = read_tools_file(args.tools)
    from hyfunc.routing.recording import RecordedMethod, traffic_log

    log = traffic_log(args.traffic)
    method = _build_method(args)
    # The cascade reads a fixed library once; above MAX_PROMPT_TOOLS no prompt holds it, and it
    # is read per function (with the artifact's library retriever) instead.
    if hasattr(method, "use_library") and (args.prefix_caching or len(tools) > method.MAX_PROMPT_TOOLS):
        with steps("reading the tool library", total=1) as progress:
            progress.next(f"{len(tools)} tools")
            method.use_library(tools)
    if log is not None:
        method = RecordedMethod(method, log)
    answer = method.answer([{"role": "user", "content": args.query}], tools)
    if args.timings:
        print(_format_timings(answer), file=sys.stderr)
    print(format_answer(answer, args.format))
    if answer.error is not None and args.format != "json":  # the json form carries the error itself
        print(f"error: {one_line(answer.error)}", file=sys.stderr)
    if log is not None:
        health = log.close()
        where = log.store.url
        if health.written:
            store = " --store URL" if args.traffic else ""
            print(f"logged as {answer.details['request_id']} in {where} (feedback: hyfunc odia feedback "
                  f"{answer.details['request_id']} good|bad{store})", file=sys.stderr)
        else:
            print(f"warning: not logged to {where}: {health.last_error}", file=sys.stderr)
    return 0 if answer.error is None else 1


def cmd_eval_bfcl(args: argparse.Namespace) -> int:
    from hyfunc.eval.bfcl import run_side_by_side

    categories = check_bfcl_inputs(args.categories or CATEGORIES, args.data_dir)  # before any model loads
    check_method_options(args)
    methods = _side_by_side_methods(args)
    main_label = next(iter(methods))
    out_dir = Path(args.out or f"reports/{_dir_name(main_label)}")
    if len(methods) == 1:
        dirs = {main_label: out_dir}
    else:
        dirs = {label: out_dir / _dir_name(label) for label in methods}
    summaries = run_side_by_side(methods, categories, args.limit, dirs, args.data_dir, resume=not args.no_resume)
    if len(methods) == 1:
        print((out_dir / "results.md").read_text())
    else:
        from hyfunc.eval.report import compare_runs

        baseline = next((label for label in methods if label.startswith("direct:")), None)
        paths = compare_runs([dirs[label] for label in methods], out_dir, names=list(methods), baseline=baseline)
        print(paths["md"].read_text())
    return 0 if all(summaries.values()) else 1


def _dir_name(label: str) -> str:
    return label.replace(":", "_").replace("/", "_")


def _ablation_variants(cascade, specs: list[str]) -> dict:
    """label -> the cascade with the `--ablations` item's stages off (sharing its large-model pass)."""
    from hyfunc.methods.cascade import CascadeOptions

    return {
        f"hyfunc-no-{spec}": cascade.variant(CascadeOptions.without(*spec.split("+")), f"hyfunc-no-{spec}")
        for spec in specs
    }


def _side_by_side_methods(args: argparse.Namespace) -> dict:
    """The main method, its ablations and the direct baselines, sharing loaded models."""
    main = _build_method(args)
    kind = "routed" if getattr(args, "router", None) else "hyfunc"
    methods = {main.name if args.method == "direct" else f"{kind}@{main.large.engine}": main}
    methods.update(_ablation_variants(main, args.ablations))
    for spec in args.with_cascade:
        from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod

        artifact, _, engines = spec.partition("@")
        large_engine, _, small_engine = (engines or args.engine).partition(",")
        other = HyFuncMethod.load(
            DEFAULT_ARTIFACT if artifact == "shipped" else artifact, device=args.device, large=main.large,
            large_engine=check_engine(large_engine), small_engine=check_engine(small_engine or large_engine),
        )
        if other.large is main.large:
            main.share_large_pass(other)  # the same large model reads the same prompt: one pass per case
        label = other.name + (f"@{engines}" if engines else "")
        if label in methods:
            label += "-2"
        methods[label] = other
    for spec in args.with_direct:
        model, engine, direct = _direct_baseline(spec, args, getattr(main, "large", None))
        methods[f"direct:{model}" + (f"@{engine}" if "@" in spec else "")] = direct
    return methods


def _direct_baseline(spec: str, args: argparse.Namespace, large, prefix_caching: bool = False) -> tuple:
    """(model, engine, direct method) of a MODEL[@ENGINE] spec. A cascade's large model that is the
    same network on the same engine answers directly too: no second copy is loaded."""
    from hyfunc.methods import load_method

    model, _, engine = spec.partition("@")
    engine = resolve_engine(engine or args.engine, model, args.device)
    backend = large if large is not None and large.name == model and large.engine == engine else None
    direct = load_method(
        "direct", model=model, device=args.device, prefix_caching=prefix_caching, backend=backend, engine=engine
    )
    return model, engine, direct


def cmd_eval_compare(args: argparse.Namespace) -> int:
    from hyfunc.eval.report import compare_runs

    paths = compare_runs(args.runs, args.out)
    print(paths["md"].read_text())
    return 0


def cmd_bench_library(args: argparse.Namespace) -> int:
    from hyfunc.eval.library import (
        library_examples,
        run_library_benchmark,
        write_library_report,
    )
    from hyfunc.methods import load_method

    models = [split_engine_spec(spec)[0] for spec in args.with_direct or []]
    check_loadable(models, [args.artifact] if args.artifact else [], args.device)
    examples, tools = library_examples(args.data, args.requests, args.seed)
    with steps("loading models", total=2) as progress:
        progress.next("the cascade")
        cascade = load_method(
            "hyfunc", artifact=args.artifact, device=args.device, engine=args.engine, small_engine=args.small_engine
        )
        methods = {"hyfunc": cascade}
        methods.update(_ablation_variants(cascade, args.ablations))
        progress.next("direct prompting")
        for spec in args.with_direct or [f"{cascade.large.name}@{args.engine}"]:
            model, engine, direct = _direct_baseline(spec, args, cascade.large, prefix_caching=True)
            methods[f"direct:{model}@{engine}"] = direct
    result = run_library_benchmark(methods, examples, tools)
    paths = write_library_report(result, args.out)
    print(paths["md"].read_text())
    return 0


def cmd_bench_retriever(args: argparse.Namespace) -> int:
    from hyfunc.cascade.library import load_library
    from hyfunc.eval.retrieval import (
        library_requests,
        run_retrieval_benchmark,
        write_retrieval_report,
    )
    from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod

    check_loadable([], [args.artifact] if args.artifact else [], args.device)
    library = load_library(args.library)
    requests = library_requests(args.data, library, args.limit)
    if not requests:
        raise InputError(f"no held-out example in {args.data} calls only tools of {args.library}")
    with steps("loading the cascade", total=1) as progress:
        progress.next("models")
        cascade = HyFuncMethod.load(args.artifact or DEFAULT_ARTIFACT, device=args.device)
    retrievers = {"joint (trained on tool-list prompts)": cascade.retriever}
    if cascade.library_retriever is not None:
        retrievers["library (per-function mode)"] = cascade.library_retriever
    result = run_retrieval_benchmark(cascade.encoder, retrievers, library, requests, method=cascade)
    paths = write_retrieval_report(result, args.out)
    print(paths["md"].read_text())
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from hyfunc.cascade.prepare import PrepareConfig, add_gate, prepare

    if args.gate_only:
        if not (Path(args.out) / MANIFEST).is_file():
            raise InputError(f"--gate-only: {args.out} is not a prepared cascade (no manifest.json)")
        metrics = add_gate(Path(args.out), args.data, args.seed)
        print(json.dumps({"artifact": args.out, "off_topic_gate": metrics}, indent=2))
        return 0

    config = PrepareConfig(
        large_model=args.large, small_model=args.small, data=args.data, sft_epochs=args.epochs,
        lora_rank=args.lora_rank, max_examples=args.max_examples, sft_max_items=args.sft_max_items, seed=args.seed,
        library=args.library, repeat_fraction=args.repeat_fraction,
        off_topic_gate=not args.no_off_topic_gate,
    )
    manifest = prepare(config, Path(args.out))
    print(json.dumps({"artifact": args.out, "metrics": manifest["metrics"], "seconds": manifest["seconds"]}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyfunc", description="Requests + tools -> function calls.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="answer a few requests against a sample tool library")
    _add_method_args(demo, prefix_caching=True)
    demo.set_defaults(func=cmd_demo)

    call = sub.add_parser("call", help="answer one request against tools from a JSON file")
    call.add_argument("--tools", required=True, help="JSON file: a list of tools (OpenAI, BFCL or JSON Schema) or {'tools': [...]}")
    call.add_argument("--query", required=True)
    call.add_argument("--timings", action="store_true", help="print the latency breakdown to stderr")
    call.add_argument(
        "--format", default="json", choices=CALL_FORMATS,
        help="json: {calls, error} (default); openai: an assistant message with tool_calls; python: [f(a=1)]",
    )
    from hyfunc.routing.recording import TRAFFIC_HELP

    call.add_argument("--traffic", nargs="?", const="", default=None, metavar="URL", help=TRAFFIC_HELP)
    _add_method_args(call, prefix_caching=True)
    call.set_defaults(func=cmd_call)

    evaluate = sub.add_parser("eval", help="benchmarks")
    eval_sub = evaluate.add_subparsers(dest="benchmark", required=True)
    bfcl = eval_sub.add_parser("bfcl", help="score on BFCL with the official checker")
    _add_method_args(bfcl, prefix_caching=False)
    bfcl.add_argument(
        "--categories", nargs="+",
        help=f"default: {' '.join(CATEGORIES)}; also {' '.join(EXTRA_CATEGORIES + list(ALIASES))}",
    )
    bfcl.add_argument("--limit", type=int, default=None, help="first N cases per category")
    bfcl.add_argument("--out", help="report directory (default: reports/<method>)")
    bfcl.add_argument("--data-dir", help="a data set laid out like BFCL's (question files + possible_answer/)")
    bfcl.add_argument("--no-resume", action="store_true", help="start over instead of skipping cases already scored")
    bfcl.add_argument(
        "--with-direct", nargs="+", default=[], metavar="MODEL",
        help="also answer every case by direct prompting with these models (MODEL or MODEL@ENGINE), "
        "interleaved with the main method (side by side); the first is the baseline of the latency ratios",
    )
    bfcl.add_argument(
        "--with-cascade", nargs="+", default=[], metavar="ARTIFACT",
        help="also answer every case with these prepared cascades, side by side: ARTIFACT, ARTIFACT@ENGINE or "
        "ARTIFACT@LARGE_ENGINE,SMALL_ENGINE ('shipped' = the shipped one)",
    )
    bfcl.add_argument(
        "--ablations", nargs="+", default=[], type=_ablation, metavar="STAGE[+STAGE]",
        help=f"also run the cascade with each of these stages switched off, one variant each; STAGE+STAGE: "
        f"a variant with both off (stages: {', '.join(ABLATABLE)})",
    )
    bfcl.set_defaults(func=cmd_eval_bfcl)
    compare = eval_sub.add_parser("compare", help="merge several BFCL runs into one table and plot")
    compare.add_argument("runs", nargs="+", help="report directories of `hyfunc eval bfcl`")
    compare.add_argument("--out", required=True, help="where comparison.{json,md,png} go")
    compare.set_defaults(func=cmd_eval_compare)

    bench = sub.add_parser("bench", help="latency benchmarks")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True)
    lib = bench_sub.add_parser("library", help="fixed tool library (server case): cascade vs direct, both with a KV cache")
    lib.add_argument("--data", nargs="+", required=True, help="fc-train files or directories (held-out examples are used)")
    lib.add_argument("--requests", type=int, default=12, help="held-out examples; their tools form the library")
    lib.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    lib.add_argument(
        "--with-direct", nargs="+", metavar="MODEL[@ENGINE]",
        help="models answering directly, each with its prefix cache (default: the cascade's large model on --engine)",
    )
    lib.add_argument(
        "--ablations", nargs="+", default=[], type=_ablation, metavar="STAGE[+STAGE]",
        help="also run the cascade with these stages off, one variant each (sharing its large-model pass)",
    )
    lib.add_argument("--device", default=None)
    lib.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="engine of the cascade's models")
    lib.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    lib.add_argument("--seed", type=int, default=0)
    lib.add_argument("--out", default="reports/library", help="where library.{json,md,png} go")
    lib.set_defaults(func=cmd_bench_library)

    ret = bench_sub.add_parser("retriever", help="recall@k and search latency of the retriever over a whole tool library")
    ret.add_argument("--library", required=True, help="JSON Lines of tool schemas (or a directory of them)")
    ret.add_argument("--data", nargs="+", required=True, help="fc-train files; held-out requests whose tools are in the library")
    ret.add_argument("--limit", type=int, default=None, help="at most N requests")
    ret.add_argument("--artifact", help="cascade directory (default: the shipped one)")
    ret.add_argument("--device", default=None)
    ret.add_argument("--out", default="reports/retrieval", help="where retrieval.{json,md,png} go")
    ret.set_defaults(func=cmd_bench_retriever)

    from hyfunc.eval.odia_cli import add_bench_odia_parser, add_small_retrieval_parser
    from hyfunc.eval.refusal import add_bench_refusal_parser
    from hyfunc.serving.bench import add_bench_serve_parser

    add_small_retrieval_parser(bench_sub)
    add_bench_odia_parser(bench_sub)
    add_bench_refusal_parser(bench_sub)

    add_bench_serve_parser(bench_sub)

    prep = sub.add_parser("prepare", help="train a cascade (embeddings, retriever, small model); resumable")
    prep.add_argument("--large", default=DEFAULT_LARGE, help="large model (soft token, function embeddings)")
    prep.add_argument("--small", default=DEFAULT_SMALL, help="small model (writes the argument values)")
    prep.add_argument("--data", nargs="+", required=True, help="training JSON Lines files or directories (never BFCL)")
    prep.add_argument("--out", required=True, help="artifact directory (re-run the same command to resume)")
    prep.add_argument("--epochs", type=int, default=1, help="small-model fine-tuning epochs")
    prep.add_argument("--lora-rank", type=int, default=16, help="LoRA rank of the small model; 0 trains the projector only")
    prep.add_argument("--max-examples", type=int, default=None, help="a seeded sample of N examples, balanced by call pattern")
    prep.add_argument("--sft-max-items", type=int, default=None, help="fine-tune the small model on N items, balanced by call pattern")
    prep.add_argument(
        "--repeat-fraction", type=float, default=0.0,
        help="add this fraction of repeated-call examples, joined from single-call requests of the data (BFCL's parallel case)",
    )
    prep.add_argument(
        "--no-off-topic-gate", action="store_true",
        help="skip the off-topic gate, which refuses small talk (about 400 large-model passes)",
    )
    prep.add_argument("--gate-only", action="store_true",
                      help="only (re)train the off-topic gate of the cascade already in --out, on --data")
    prep.add_argument("--library", default=None, help="a large tool library (JSON Lines): also train its per-function retriever")
    prep.add_argument("--seed", type=int, default=0)
    prep.set_defaults(func=cmd_prepare)

    from hyfunc.models.cli import add_models_parser

    add_models_parser(sub)

    from hyfunc.serving.cli import add_serve_parser

    add_serve_parser(sub)

    from hyfunc.routing.cli import (
        add_odia_parser,  # learning from traffic: `hyfunc odia ...`
    )

    add_odia_parser(sub)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as err:
        # The one place that turns an error the user can fix into one line (see hyfunc/errors.py).
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
