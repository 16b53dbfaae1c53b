"""The cascade and its variants on fc-train's validation split (never BFCL): exact calls per call
pattern, side by side with one shared large pass per request.

    python scripts/fc_validation.py --limit 90 --ablations large_values --out reports/large-values/fc-validation.json

Requests with calls, offered their own tools, sampled with equal shares per call pattern (single,
distinct tools, one tool repeated) as `hyfunc prepare` samples; exact = `same_calls` with gold
(names and arguments after normalisation, any order). `--small-path`: the small path (ODIA's routed
path: selector + the cascade's small model, no large model) answers too, and each cascade variant's
agreement with it is reported: the share of requests ODIA's mining would label simple.

    python scripts/fc_validation.py --limit 90 --ablations large_values --small-path \
        --out reports/large-values/small-path-agreement.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from hyfunc.cascade.data import call_pattern, load_examples, sample_by_pattern, split_examples
from hyfunc.cascade.selector import ToolSelector, default_selector_dir
from hyfunc.data import FC_TRAIN
from hyfunc.eval.provenance import provenance
from hyfunc.formats.calls import Call, same_calls
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, CascadeOptions, HyFuncMethod
from hyfunc.methods.small import SmallMethod
from hyfunc.routing.routed import SharedEmbedder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--artifact", default=str(DEFAULT_ARTIFACT))
    parser.add_argument("--limit", type=int, default=90)
    parser.add_argument("--ablations", nargs="*", default=[], help="CascadeOptions switched off, one variant each (a+b: both off in one)")
    parser.add_argument("--small-path", action="store_true", help="also answer with the small path; report agreement")
    parser.add_argument("--engine", default="auto", help="engine of both models (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    _, val = split_examples(load_examples(args.data))
    callers = [ex for ex in val if ex.answers and ex.tools]
    requests = sample_by_pattern(callers, args.limit, args.seed) if args.limit < len(callers) else callers
    main_method = HyFuncMethod.load(args.artifact, large_engine=args.engine, small_engine=args.engine)
    methods = {"hyfunc": main_method}
    for spec in args.ablations:  # a stage, or stages joined by '+' (one variant, all off)
        methods[f"hyfunc-no-{spec}"] = main_method.variant(CascadeOptions.without(*spec.split("+")), f"hyfunc-no-{spec}")
    cascades = list(methods)
    if args.small_path:
        embedder = SharedEmbedder()
        if main_method.gate is not None:
            main_method.gate.share_embedder(embedder)  # one MiniLM and one tool-vector cache, as `hyfunc bench odia`
        methods["small-path"] = SmallMethod(main_method.small, ToolSelector.load(default_selector_dir(), embedder))
    rows = []
    for ex in tqdm(requests, desc="fc-train validation", unit="req"):
        row = {"id": ex.id, "pattern": call_pattern(ex), "gold": [[c.name, c.arguments] for c in ex.answers]}
        for label, method in methods.items():
            start = time.perf_counter()
            answer = method.answer([{"role": "user", "content": ex.query}], ex.tools)
            row[label] = {"exact": same_calls(answer.calls, ex.answers), "seconds": time.perf_counter() - start + answer.reused_seconds,
                          "calls": [[c.name, c.arguments] for c in answer.calls]}
        rows.append(row)
    summary = {}
    for label in methods:
        by_pattern = Counter(r["pattern"] for r in rows if r[label]["exact"])
        summary[label] = {"exact": sum(r[label]["exact"] for r in rows), "n": len(rows), "by_pattern": dict(by_pattern),
                          "median_seconds": statistics.median(r[label]["seconds"] for r in rows)}
        if args.small_path and label in cascades:
            # ODIA's mining label: the small path's calls equal this cascade's (`same_calls`)
            summary[label]["small_path_agrees"] = sum(
                same_calls(_calls(r["small-path"]["calls"]), _calls(r[label]["calls"])) for r in rows)
    result = {"command": sys.argv, "provenance": provenance(list(methods.values())), "patterns": dict(Counter(r["pattern"] for r in rows)),
              "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
    print(json.dumps({"patterns": result["patterns"], "summary": summary}, indent=1))
    return 0


def _calls(rows: list) -> list[Call]:
    return [Call(name, arguments) for name, arguments in rows]


if __name__ == "__main__":
    sys.exit(main())
