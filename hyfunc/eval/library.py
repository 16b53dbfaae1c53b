"""The server case: one fixed tool library, many requests (`hyfunc bench library`).

Both sides read the library once and keep its KV cache: the cascade through
`HyFuncMethod.use_library` (per request the large model runs only the request's tokens), direct
prompting through its exact prefix cache (the prompt up to the request is the same every time).
Requests are answered alternately by the two methods, so machine noise falls on both alike; the
report gives per-request latencies, their medians and the ratio cascade / direct.

Requests and tools come from held-out fc-train examples (the validation side of the split that
`hyfunc prepare` uses), never from BFCL: the library is the union of the tools of `n` such examples
and each of their requests is asked against the whole library.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path
from typing import Sequence

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.errors import InputError
from hyfunc.eval.plots import pyplot
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.formats.calls import same_calls
from hyfunc.formats.schema import Tool
from hyfunc.progress import steps


def library_examples(data: Sequence[str], n: int, seed: int = 0) -> tuple[list[Example], list[Tool]]:
    """`n` held-out examples that call a tool, and the union of their tools (first schema per name)."""
    _, held_out = split_examples(load_examples(data))
    callers = [ex for ex in held_out if ex.answers]
    if len(callers) < n:
        raise InputError(f"only {len(callers)} held-out examples with a call in {list(data)}; asked for {n}")
    chosen = random.Random(seed).sample(callers, n)
    tools: dict[str, Tool] = {}
    for ex in chosen:
        for tool in ex.tools:
            tools.setdefault(tool.name, tool)
    # An example whose tool was shadowed by another schema of the same name is not answerable as written.
    chosen = [ex for ex in chosen if all(tools[t.name] == t for t in ex.tools)]
    return chosen, list(tools.values())


def run_library_benchmark(methods: dict, examples: list[Example], tools: list[Tool]) -> dict:
    """`methods`: label -> method with `use_library` or a prefix cache. Returns per-method records
    and medians; the first label is compared with the others (ratio of medians)."""
    from tqdm import tqdm

    # Reading the library takes minutes on a CPU (the direct side also decodes its warm-up
    # answer): a bar shows which method is at it from the first second.
    with steps(f"reading the {len(tools)}-tool library", total=len(methods)) as progress:
        for label, method in methods.items():
            progress.next(label)
            if hasattr(method, "use_library"):
                method.use_library(tools)
            # Fills the direct side's prefix cache with the library (a request not among those timed).
            method.answer([{"role": "user", "content": "Hello!"}], tools)
    records: dict[str, list[dict]] = {label: [] for label in methods}
    for ex in tqdm(examples, desc="library requests", unit="req"):
        for label, method in methods.items():
            answer = method.answer([{"role": "user", "content": ex.query}], tools)
            records[label].append({
                "id": ex.id,
                "latency": answer.latency,  # the sum of the stages' times, a reused large pass included
                "timings": answer.timings,
                "reused_seconds": answer.reused_seconds,
                "input_tokens": answer.input_tokens,
                "cached_tokens": answer.cached_tokens,
                "output_tokens": answer.output_tokens,
                "injected_tokens": answer.injected_tokens,
                "names_match": sorted(c.name for c in answer.calls) == sorted(c.name for c in ex.answers),
                "exact_match": same_calls(answer.calls, ex.answers),
            })
    labels = list(methods)
    summary = {
        label: {
            "n": len(recs),
            "latency_median": statistics.median(r["latency"] for r in recs),
            "latency_mean": statistics.fmean(r["latency"] for r in recs),
            "names_match": statistics.fmean(r["names_match"] for r in recs),
            "exact_match": statistics.fmean(r["exact_match"] for r in recs),
            "cached_tokens_median": statistics.median(r["cached_tokens"] for r in recs),
        }
        for label, recs in records.items()
    }
    first = labels[0]
    ratios = {
        f"{first} / {other}": summary[first]["latency_median"] / summary[other]["latency_median"] for other in labels[1:]
    }
    return {"library_tools": len(tools), "requests": len(examples), "summary": summary,
            "ratio_of_medians": ratios, "records": records, "provenance": provenance(methods.values())}


def write_library_report(result: dict, out_dir: str | Path) -> dict[str, Path]:
    plt = pyplot()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "library.json", "md": out / "library.md", "png": out / "library.png"}
    result = {**result, "command": list(sys.argv)}
    paths["json"].write_text(json.dumps(result, indent=2, default=repr) + "\n", encoding="utf-8")
    lines = [
        "# Fixed tool library: cascade vs direct prompting, both with the library's KV cache", "",
        f"Command: `{' '.join(result['command'])}`", "",
        provenance_markdown(result.get("provenance")), "",
        f"{result['library_tools']} tools in the library, {result['requests']} held-out fc-train requests, "
        "answered alternately by each method.", "",
        "| method | n | p50 latency s | mean s | cached tokens (median) | names match % | exact match % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, s in result["summary"].items():
        lines.append(f"| {label} | {s['n']} | {s['latency_median']:.3f} | {s['latency_mean']:.3f} | "
                     f"{s['cached_tokens_median']:.0f} | {100 * s['names_match']:.0f} | {100 * s['exact_match']:.0f} |")
    lines += [""] + [f"p50 ratio {name}: **{ratio:.3f}**" for name, ratio in result["ratio_of_medians"].items()]
    stages = list(dict.fromkeys(k for recs in result["records"].values() for r in recs for k in r["timings"]))
    lines += ["", "Mean seconds per stage (a reused large pass counts where it was reused too):", "",
              "| method | " + " | ".join(stages) + " |", "|---|" + "---:|" * len(stages)]
    for label, recs in result["records"].items():
        means = [statistics.fmean(r["timings"].get(stage, 0.0) for r in recs) for stage in stages]
        lines.append(f"| {label} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    paths["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(result["records"])
    ax.boxplot([[r["latency"] for r in result["records"][label]] for label in labels], showmeans=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency per request (s, log)")
    ax.set_title(f"fixed library of {result['library_tools']} tools: latency per request")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=120)
    plt.close(fig)
    return paths
