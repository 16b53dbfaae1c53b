"""A version's small path on the fc-train validation requests of a committed `fc_validation.py
--small-path` run: agreement with that run's cascade answers and exact calls against gold, with
no cascade pass (its answers are read from the report). When the version has a router, also the
routed system: the router's decision on each request (from the small path's answer, as small-first
serving decides) and its calls (the small path's where routed, else the cascade's from the report),
against gold beside the cascade alone. The cascade's off-topic gate is not run: these are all call
requests.

    python scripts/small_path_agreement.py --reference reports/cpu-llamacpp/fc-validation-small-path.json \
        --version <versions dir>/versions/<id> --out small-path-agreement.json

`--version` is a version directory (its `small/`) or a `small/`-like directory of its own. `--shipped-gguf`
runs the default models' shipped GGUF files on llama.cpp instead of the type the registry names (a side-by-side
of the requantized small model).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.data import FC_TRAIN
from hyfunc.eval.provenance import provenance
from hyfunc.formats.calls import Call, same_calls
from hyfunc.methods.cascade import DEFAULT_ARTIFACT
from hyfunc.models.registry import DEFAULT_MODELS
from hyfunc.routing.routed import SharedEmbedder, artifact_adapter, load_small
from hyfunc.routing.router import Router


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a fc_validation.py report (its rows give requests and cascade answers)")
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--version", required=True)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--artifact", default=str(DEFAULT_ARTIFACT),
                        help="the cascade the version routes against (its adapter, where the version names it)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--shipped-gguf", action="store_true", help="llama.cpp runs the shipped GGUF files, not requantized copies")
    args = parser.parse_args()
    if args.shipped_gguf:
        for alias, spec in DEFAULT_MODELS.items():
            DEFAULT_MODELS[alias] = dataclasses.replace(spec, llamacpp_type=None)

    reference = json.loads(Path(args.reference).read_text())
    _, val = split_examples(load_examples(args.data))
    by_id = {ex.id: ex for ex in val}
    version = Path(args.version)
    embedder = SharedEmbedder()
    small = load_small(version / "small" if (version / "small").is_dir() else version, embedder, args.engine,
                       cascade_adapter=artifact_adapter(args.artifact))
    router = Router.load(version / "router", embedder=embedder) if (version / "router").is_dir() else None
    rows = []
    for row in reference["rows"]:
        ex = by_id[row["id"]]
        started = time.perf_counter()
        answer = small.answer([{"role": "user", "content": ex.query}], ex.tools)
        seconds = time.perf_counter() - started
        calls = [Call(c.name, c.arguments) for c in answer.calls]
        cascade_calls = [Call(n, dict(a)) for n, a in row["hyfunc"]["calls"]]
        out_row = {"id": ex.id, "seconds": seconds, "calls": [[c.name, c.arguments] for c in calls],
                   "agrees": same_calls(calls, cascade_calls), "exact": same_calls(calls, ex.answers),
                   "confidence": answer.details.get("confidence")}
        if router is not None:
            messages = [{"role": "user", "content": ex.query}]
            routed = router.route(messages, ex.tools, answer.calls, answer.details.get("confidence"),
                                  near_fit=answer.details.get("near_fit", ())) == "small"
            out_row.update({"routed_small": routed, "routed_exact": out_row["exact"] if routed else row["hyfunc"]["exact"]})
        rows.append(out_row)
    summary = {"n": len(rows), "agrees_with_cascade": sum(r["agrees"] for r in rows), "exact": sum(r["exact"] for r in rows),
               "median_seconds": statistics.median(r["seconds"] for r in rows),
               "mean_seconds": statistics.mean(r["seconds"] for r in rows), "small": small.config,
               "small_gguf": small.backend.gguf_path.name if hasattr(small.backend, "gguf_path") else None}
    if router is not None:
        on_small = [r for r in rows if r["routed_small"]]
        summary["routed"] = {"threshold": router.threshold, "on_small": len(on_small),
                             "agreeing_on_small": sum(r["agrees"] for r in on_small),
                             "exact": sum(r["routed_exact"] for r in rows),
                             "cascade_exact": sum(bool(r["hyfunc"]["exact"]) for r in reference["rows"])}
    out = {"command": sys.argv, "provenance": provenance([small]),
           "reference": args.reference, "summary": summary, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
