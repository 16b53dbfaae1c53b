"""Handlers of the experiment commands: `hyfunc eval ...` and `hyfunc bench ...` (but `bench serve`,
in hyfunc.serving.bench). Each imports its benchmark on use."""
from __future__ import annotations

import argparse
from pathlib import Path

from hyfunc.cli.checks import check_bfcl_inputs, check_loadable, check_method_options, split_engine_spec
from hyfunc.cli.commands import build_method
from hyfunc.errors import InputError
from hyfunc.formats.bfcl import CATEGORIES
from hyfunc.models.engines import check_engine, resolve_engine
from hyfunc.progress import steps


def cmd_eval_bfcl(args: argparse.Namespace) -> int:
    categories = check_bfcl_inputs(args.categories or CATEGORIES, args.data_dir)  # before any model loads
    check_method_options(args)
    summaries = _score_side_by_side(args, categories, args.data_dir, args.limit, args.out)[1]
    return 0 if all(summaries.values()) else 1


def cmd_eval_ood(args: argparse.Namespace) -> int:
    import json

    from hyfunc.eval.ood import (
        build_cases, first_calls_right, kind_markdown, kind_plot, kind_summary, write_bfcl_layout,
    )
    from hyfunc.eval.records import read_case_records

    out = Path(args.out)
    cases = build_cases(args.data, args.sources, args.per_source, args.seed)
    counts = write_bfcl_layout(cases, out / "data")
    categories = check_bfcl_inputs([c for c in CATEGORIES if c in counts], str(out / "data"))
    check_method_options(args)
    dirs, _, methods = _score_side_by_side(args, categories, str(out / "data"), None, str(out))
    kinds = json.loads((out / "data" / "kinds.json").read_text(encoding="utf-8"))
    main = next(iter(methods))
    baseline = next((label for label in methods if label.startswith("direct:")), None)
    records = {label: read_case_records(d) for label, d in dirs.items()}
    summary = kind_summary(records, kinds, main, baseline)
    summary["first_call"] = first_calls_right({label: [r for r in recs if r["id"] in kinds] for label, recs in records.items()},
                                              out / "data")
    summary["set"] = {"sources": args.sources, "per_source": args.per_source, "seed": args.seed, "categories": counts,
                      "trained_on": {label: _trained_on(m, args.sources) for label, m in methods.items()}}
    (out / "kinds.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "kinds.md").write_text(kind_markdown(summary) + "\n", encoding="utf-8")
    kind_plot(summary, out / "kinds.png")
    print(kind_markdown(summary))
    for label, sources in summary["set"]["trained_on"].items():
        if sources:
            print(f"note: {label} was trained on {', '.join(sources)}: not out of distribution for it")
    return 0


def _trained_on(method, held_out: list[str]) -> list[str]:
    """The held-out sources a cascade's training data held (from its manifest's data paths)."""
    import json

    from hyfunc.cascade.data import jsonl_files

    artifact = getattr(method, "artifact", None)
    if artifact is None or not (Path(artifact) / "manifest.json").is_file():
        return []
    stems = set()
    for path in json.loads((Path(artifact) / "manifest.json").read_text())["data"]["paths"]:
        try:
            stems.update(f.stem for f in jsonl_files(path))
        except InputError:  # prepared elsewhere: a file's name is all that is known here
            stems.add(Path(path).stem)
    return [s for s in held_out if s in stems]


def _score_side_by_side(args: argparse.Namespace, categories: list[str], data_dir: str | None, limit: int | None,
                        out: str | None) -> tuple[dict, dict, dict]:
    """Run the main method and those beside it on the cases, print the comparison; returns
    (label -> report directory, label -> summary, label -> method)."""
    from hyfunc.eval.bfcl import run_side_by_side

    methods = _side_by_side_methods(args)
    main_label = next(iter(methods))
    out_dir = Path(out or f"reports/{_dir_name(main_label)}")
    if len(methods) == 1:
        dirs = {main_label: out_dir}
    else:
        dirs = {label: out_dir / _dir_name(label) for label in methods}
    summaries = run_side_by_side(methods, categories, limit, dirs, data_dir, resume=not args.no_resume)
    if len(methods) == 1:
        print((out_dir / "results.md").read_text())
    else:
        from hyfunc.eval.report import compare_runs

        baseline = next((label for label in methods if label.startswith("direct:")), None)
        paths = compare_runs([dirs[label] for label in methods], out_dir, names=list(methods), baseline=baseline)
        print(paths["md"].read_text())
    return dirs, summaries, methods


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
    main = build_method(args)
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
        model, engine, direct = _direct_baseline(spec, args, getattr(main, "large", None), prefix_caching=args.prefix_caching)
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


def cmd_eval_answers(args: argparse.Namespace) -> int:
    import sys

    from hyfunc.eval.final_answers import answer_facts, held_out_answer_steps, write_report
    from hyfunc.models.engines import load_backend

    steps = held_out_answer_steps(args.data, args.per_source)
    if not steps:
        raise InputError(f"no conversation with calls in the validation split of {' '.join(args.data)}")
    backend = load_backend(args.model, args.engine, args.device, role="large")
    records = answer_facts(backend, steps, args.max_tokens)
    meta = {"model": args.model, "engine": backend.engine, "max_tokens": args.max_tokens, "per_source": args.per_source}
    write_report(Path(args.out), records, meta, sys.argv)
    print((Path(args.out) / "README.md").read_text())
    return 0


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


def cmd_bench_small_retrieval(args: argparse.Namespace) -> int:
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


def cmd_bench_odia(args: argparse.Namespace) -> int:
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


def cmd_bench_refusal(args: argparse.Namespace) -> int:
    from hyfunc.eval.refusal import refusal_sets, run_refusal_benchmark, write_refusal_report
    from hyfunc.methods.cascade import DEFAULT_ARTIFACT, CascadeOptions, HyFuncMethod

    sets = refusal_sets(args.data, args.calls, args.library_requests, args.seed)
    cascade = HyFuncMethod.load(args.artifact or DEFAULT_ARTIFACT, device=args.device, large_engine=args.engine,
                                small_engine=args.engine)
    if cascade.gate is None:
        raise InputError(f"{cascade.artifact} has no off-topic gate: add one with `hyfunc prepare --gate-only --out DIR`")
    methods = {"with gate": cascade, "without gate": cascade.variant(CascadeOptions(off_topic_gate=False), "no-gate")}
    paths = write_refusal_report(run_refusal_benchmark(methods, sets), args.out)
    print(paths["md"].read_text())
    return 0
