"""`hyfunc bench refusal`: what the off-topic gate refuses and what it costs, side by side with the
same cascade without its gate (both share each request's large-model pass).

Three sets, none from BFCL and none the gate was trained on:
- off-topic: hyfunc/data/off_topic_heldout.txt, requests written for this benchmark (small talk,
  general knowledge, advice, creative writing, some in French, Spanish, German), each shown the
  demo's six everyday tools and, again, the tools of a held-out fc-train request;
- calls: held-out fc-train call requests (the validation split) with their own tools;
- library: the fixed-library benchmark's requests against its whole library, read once
  (`use_library`, as `hyfunc bench library` does).
Per method and set: the share refused, the share answered with exactly the gold calls
(`same_calls`), and the median latency. BFCL's irrelevance categories are measured by
`hyfunc eval bfcl --ablations off_topic_gate` with the official checker.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.eval.library import library_examples
from hyfunc.eval.plots import pyplot
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.formats.calls import render_json_calls, same_calls
from hyfunc.formats.schema import Tool, parse_tools


def held_out_off_topic() -> list[str]:
    text = resources.files("hyfunc.data").joinpath("off_topic_heldout.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def demo_tools() -> list[Tool]:
    return parse_tools(json.loads(resources.files("hyfunc.data").joinpath("demo.json").read_text())["tools"])


def refusal_sets(data: Sequence[str], calls: int, library_requests: int, seed: int = 0) -> dict[str, Any]:
    """{set name: [(request, tools, gold calls or None for off-topic)]}, and the library's tools."""
    rng = random.Random(seed)
    _, val = split_examples(load_examples(list(data)))
    callers = [ex for ex in val if ex.answers and ex.tools]
    everyday = demo_tools()
    off = held_out_off_topic()
    sets: dict[str, list[tuple[str, list[Tool], list | None]]] = {
        "off-topic, demo tools": [(q, everyday, None) for q in off],
        "off-topic, fc-train tools": [(q, rng.choice(callers).tools, None) for q in off],
        "fc-train calls": [(ex.query, ex.tools, ex.answers) for ex in rng.sample(callers, min(calls, len(callers)))],
    }
    examples, library = library_examples(list(data), library_requests, seed)
    sets["fixed library"] = [(ex.query, library, ex.answers) for ex in examples]
    return {"sets": sets, "library": library}


def _answer_all(methods: dict[str, Any], items: list[tuple[str, list[Tool], list | None]], desc: str) -> dict[str, list[dict]]:
    records: dict[str, list[dict]] = {label: [] for label in methods}
    for query, tools, gold in tqdm(items, desc=desc, unit="req"):
        for label, method in methods.items():
            answer = method.answer([{"role": "user", "content": query}], tools)
            records[label].append({
                "request": query, "calls": render_json_calls(answer.calls), "refused": not answer.calls,
                "exact": None if gold is None else same_calls(answer.calls, gold),
                "latency": answer.latency, "refused_by": answer.details.get("refused_by"),
            })
    return records


def run_refusal_benchmark(methods: dict[str, Any], sets: dict[str, Any]) -> dict:
    """`methods`: label -> cascade (the gated one first). Each request is answered by every method in turn."""
    results: dict[str, dict] = {}
    for name, items in sets["sets"].items():
        if name == "fixed library":  # read once; the other methods share the first one's large model
            first, *others = methods.values()
            first.use_library(sets["library"])
            for method in others:
                method.set_library_state(first.library_state())
        records = _answer_all(methods, items, name)
        if name == "fixed library":
            for method in methods.values():
                method.set_library_state(None)
        summary = {}
        for label, rows in records.items():
            exact = [r["exact"] for r in rows if r["exact"] is not None]
            summary[label] = {
                "n": len(rows), "refused": sum(r["refused"] for r in rows) / len(rows),
                "exact": sum(exact) / len(exact) if exact else None,
                "latency_median": statistics.median(r["latency"] for r in rows),
            }
        results[name] = {"summary": summary, "records": records}
    return {"sets": results, "library_tools": len(sets["library"]), "provenance": provenance(methods.values())}


def write_refusal_report(result: dict, out_dir: str | Path) -> dict[str, Path]:
    plt = pyplot()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "refusal.json", "md": out / "refusal.md", "png": out / "refusal.png"}
    result = {**result, "command": list(sys.argv)}
    paths["json"].write_text(json.dumps(result, indent=2, default=repr) + "\n", encoding="utf-8")
    labels = list(next(iter(result["sets"].values()))["summary"])
    lines = ["# Refusal: the cascade with and without its off-topic gate", "",
             f"Command: `{' '.join(result['command'])}`", "", provenance_markdown(result.get("provenance")), "",
             f"The fixed library has {result['library_tools']} tools. Refused: no call. Exact: the gold calls "
             "(fc-train's labels). Latency: median seconds per request.", "",
             "| set | n | " + " | ".join(f"{label}: refused % | exact % | p50 s" for label in labels) + " |",
             "|---|---:|" + "---:|---:|---:|" * len(labels)]
    for name, part in result["sets"].items():
        cells = []
        for label in labels:
            s = part["summary"][label]
            exact = "" if s["exact"] is None else f"{100 * s['exact']:.1f}"
            cells.append(f"{100 * s['refused']:.1f} | {exact} | {s['latency_median']:.2f}")
        lines.append(f"| {name} | {part['summary'][labels[0]]['n']} | " + " | ".join(cells) + " |")
    paths["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(result["sets"])
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        ax.bar([x + i * width for x in range(len(names))],
               [100 * result["sets"][n]["summary"][label]["refused"] for n in names], width, label=label)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(names))], names, fontsize=8)
    ax.set_ylabel("refused %")
    ax.set_title("requests refused (want: all off-topic, no calls)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=120)
    plt.close(fig)
    return paths
