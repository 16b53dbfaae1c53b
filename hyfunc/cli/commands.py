"""Handlers of the user-facing commands: demo, call, prepare, models, serve."""
from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from hyfunc.cascade.manifest import MANIFEST
from hyfunc.cli.checks import check_method_options, format_answer, one_line
from hyfunc.config import hyfunc_home, threads
from hyfunc.errors import InputError
from hyfunc.formats.calls import render_python_calls
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.tools_file import read_tools_file
from hyfunc.methods.base import Answer
from hyfunc.models.engines import resolve_engine
from hyfunc.models.registry import DEFAULT_LARGE, DEFAULT_MODELS, resolve_model
from hyfunc.progress import steps
from hyfunc.routing.store import Retention


def build_method(args: argparse.Namespace):
    """The method the options ask for, loaded, after every check that needs no model."""
    from hyfunc.methods import load_method

    check_method_options(args)
    threads()  # a bad HYFUNC_THREADS fails here, not after seconds of loading behind a progress bar
    if getattr(args, "router", None) and args.method != "hyfunc":
        raise InputError("--router routes between the small path and the cascade: it needs --method hyfunc")
    start = time.perf_counter()
    with steps(f"loading {args.method}", total=1) as progress:
        progress.next("models")
        # A fixed tool library (demo, call) is read once; BFCL cases each bring their own tools.
        # Only `eval bfcl` switches stages off (--ablate): an experiment, not a user's setting.
        method = load_method(
            args.method, model=args.model or DEFAULT_LARGE, style=args.style or "auto", device=args.device,
            prefix_caching=args.prefix_caching, artifact=args.artifact, ablate=tuple(getattr(args, "ablate", ())),
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
    method = build_method(args)
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
    method = build_method(args)
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


def cmd_prepare(args: argparse.Namespace) -> int:
    from hyfunc.cascade.prepare import PrepareConfig, add_gate, prepare

    if args.gate_only:
        if not (Path(args.out) / MANIFEST).is_file():
            raise InputError(f"--gate-only: {args.out} is not a prepared cascade (no manifest.json)")
        metrics = add_gate(Path(args.out), args.data, args.seed)
        print(json.dumps({"artifact": args.out, "off_topic_gate": metrics}, indent=2))
        return 0

    if args.next_step_only:
        return _prepare_next_step(args)
    if args.agent_only:
        return _prepare_agent_steps(args)
    config = PrepareConfig(
        large_model=args.large, small_model=args.small, data=args.data, sft_epochs=args.epochs,
        lora_rank=args.lora_rank, max_examples=args.max_examples, sft_max_items=args.sft_max_items, seed=args.seed,
        library=args.library, repeat_fraction=args.repeat_fraction,
        schema_fraction=args.schema_variants,
        off_topic_gate=not args.no_off_topic_gate, next_step_per_source=args.per_source,
    )
    manifest = prepare(config, Path(args.out))
    print(json.dumps({"artifact": args.out, "metrics": manifest["metrics"], "seconds": manifest["seconds"]}, indent=2))
    return 0


def _prepare_next_step(args: argparse.Namespace) -> int:
    from hyfunc.cascade.next_step_training import add_next_step
    from hyfunc.eval.next_step_report import write_report

    out = Path(args.out)
    if not (out / MANIFEST).is_file():
        raise InputError(f"--next-step-only: {args.out} is not a prepared cascade (no manifest.json)")
    record = add_next_step(out, args.data, args.per_source, args.engine, hyfunc_home() / "next-step-cache", args.seed)
    if args.report:
        write_report(Path(args.report), record, sys.argv)
    print(json.dumps({"artifact": args.out, "threshold": record["threshold"], "held_out": record["held_out"]}, indent=2))
    return 0


def _prepare_agent_steps(args: argparse.Namespace) -> int:
    from hyfunc.cascade.agent_training import AgentTrainingConfig, train_agent_steps

    out = Path(args.out)
    if not (out / MANIFEST).is_file():
        raise InputError(f"--agent-only: {args.out} is not a prepared cascade (no manifest.json)")
    if args.after_results_model and args.agent_kinds != ["after_results"]:
        raise InputError("--after-results-model: the model is used only after tool results; give --agent-kinds after_results")
    config = AgentTrainingConfig(per_source=args.per_source, chained_per_source=args.chained_per_source,
                                 joined_per_source=args.joined_per_source, max_items=args.agent_items,
                                 kinds=tuple(args.agent_kinds), separate=args.after_results_model,
                                 replay=args.replay, sft_epochs=args.epochs, seed=args.seed)
    record = train_agent_steps(out, args.data, args.engine, hyfunc_home() / "next-step-cache", config)
    print(json.dumps({"artifact": args.out, **record}, indent=2))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    if args.prepare:
        for name in args.prepare:
            # Only the default aliases and local .gguf files are converted; anything else has
            # nothing to prepare, and saying "done" for a typo would hide it.
            if name not in DEFAULT_MODELS and not (name.endswith(".gguf") and Path(name).is_file()):
                raise InputError(f"cannot prepare {name!r}: not a default alias ({', '.join(DEFAULT_MODELS)}) or an existing .gguf file")
        for name in args.prepare:
            start = time.perf_counter()
            print(f"{name}: {resolve_model(name)} ({time.perf_counter() - start:.1f}s)")
        return 0
    for spec in DEFAULT_MODELS.values():
        on_llamacpp = f"; llama.cpp runs it as {spec.llamacpp_type.upper()}" if spec.llamacpp_type else ""
        print(f"{spec.alias:18} {spec.upstream}{on_llamacpp}")
    from torch import device as torch_device

    from hyfunc.models.backend import default_dtype

    # What `--engine auto` runs here, and in which precision (hyfunc.models.engines.resolve_engine).
    picks = {role: resolve_engine("auto", DEFAULT_LARGE, None, role) for role in ("large", "small", "direct")}
    dtype = str(default_dtype(torch_device("cpu"))).removeprefix("torch.")
    print(
        f"engine auto on this machine: cascade large model {picks['large']}, small model {picks['small']}, "
        f"direct prompting {picks['direct']} (transformers dtype {dtype}; llama.cpp runs the GGUF's quantisation)"
    )
    return 0


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def traffic_retention(args: argparse.Namespace) -> Retention:
    """The `Retention` of --traffic-keep-days/--traffic-keep-rows; InputError for nonsense."""
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
    config = ServeConfig(
        served_model=args.served_model_name, api_key=args.api_key, max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes, request_timeout=args.request_timeout, max_tokens_cap=args.max_tokens,
        max_tools=args.max_tools, library_cache=args.library_cache, library_cache_bytes=args.library_cache_mb * 1024**2,
        library_disk_cache_bytes=args.library_disk_cache_mb * 1024**2, max_new_tool_tokens=args.max_new_tool_tokens,
        ready_max_wait=args.ready_max_wait, library_jobs=args.library_jobs, batch=args.batch,
    )

    def load() -> Any:
        from hyfunc.methods import load_method

        start = time.perf_counter()
        # prefix_caching: the direct method reads a fixed tool library once (exact KV reuse).
        method = load_method(
            args.method, model=args.model, style=args.style, device=args.device, prefix_caching=True, artifact=args.artifact,
            engine=args.engine, small_engine=args.small_engine,
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
    # The models load in the background: /health and /health/ready answer 503 until they are ready.
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=60)
    finally:
        if traffic is not None:
            health = traffic.close()  # writes what the last requests left queued
            print(f"traffic log {traffic.store.url}: {health.written} written, {health.dropped} dropped, "
                  f"{health.lost} lost", file=sys.stderr)
    return 0
