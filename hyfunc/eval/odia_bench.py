"""`hyfunc bench odia`: learning from traffic, simulated. A stream of real fc-train requests is
served, logged, and learned from by gated cycles; after each cycle the served system is measured
on a held-out slice against the cascade alone and the large model answering directly, all in the
same run on the same machine.

- Stream: fc-train *train-split* requests in a seeded order; served in phases of `cycle_every`
  requests by the current system (the cascade alone at first, then the routed champion, with an
  exploration share sent to the cascade so the log keeps teacher answers), each answer logged
  to a fresh store (SQLite) exactly as `hyfunc serve --traffic` logs it. After each phase a
  cycle (hyfunc.routing.cycle) distils, mines, trains the router and promotes it or not.
- Held-out slice: fc-train *validation-split* requests (never served, never trained on, also
  held out of the cascade's own training). Measured first for the cascade and the direct large
  model, then after every promotion for the routed champion and the cascade again: share on the
  small path, agreement with the cascade's answers, accuracy against gold (`same_calls`),
  wall-clock latency (mean, median, p90). Systems measured together answer each request in
  turn, so their latency ratios hold even if the machine's speed drifts over a long run.
- Scenarios: each request with its own tools (default, quick), or one fixed library for every
  request (`--library`, e.g. the bundled Seal-Tools library, hyfunc.data.TOOL_LIBRARY, with the requests whose
  gold tools are in it: the server case at scale). A library too large for a prompt is offered
  to the direct model through the small path's tool selector (hyfunc.methods.preselected).
"""
from __future__ import annotations

import gc
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.cascade.selector import ToolSelector, default_selector_dir
from hyfunc.errors import InputError
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.formats.calls import same_calls
from hyfunc.formats.schema import Tool
from hyfunc.methods.preselected import PreselectedMethod
from hyfunc.routing.cycle import CycleConfig, run_cycle
from hyfunc.routing.recording import RecordedMethod
from hyfunc.routing.routed import RoutedMethod, SharedEmbedder
from hyfunc.routing.stores import open_store
from hyfunc.routing.traffic import TrafficLog
from hyfunc.routing.versions import Versions


@dataclass
class OdiaBenchConfig:
    stream: int = 600  # requests served (and logged) in all
    cycle_every: int = 150  # a cycle after each this many served requests
    held_out: int = 100  # validation-split requests the systems are measured on
    explore: float = 0.1  # share of small-path decisions served by the cascade anyway (teacher labels)
    seed: int = 0
    cycle: CycleConfig = field(default_factory=CycleConfig)


def scenario(data: Sequence[str], library: Sequence[Tool] | None, config: OdiaBenchConfig) -> tuple[list[Example], list[Example]]:
    """(stream, held-out) examples; with a fixed `library`, only requests whose gold tools are all
    in it, each then offered the whole library."""
    train, val = split_examples(load_examples(list(data)))
    if library is not None:
        names = {t.name for t in library}
        keep = lambda ex: ex.answers and all(c.name in names for c in ex.answers)  # noqa: E731
        train, val = [ex for ex in train if keep(ex)], [ex for ex in val if keep(ex)]
    else:
        train, val = [ex for ex in train if ex.tools], [ex for ex in val if ex.tools]
    rng = random.Random(config.seed)
    rng.shuffle(train)
    rng.shuffle(val)
    return train[:config.stream], val[:config.held_out]


def _tools(ex: Example, library: Sequence[Tool] | None) -> list[Tool]:
    return list(library) if library is not None else ex.tools


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def measure(methods: Mapping[str, Any], examples: Sequence[Example], library: Sequence[Tool] | None,
            reference: list[list] | None = None, desc: str = "held-out") -> dict[str, dict[str, Any]]:
    """Each method's answers, wall-clock latency, accuracy against gold, agreement with the
    `reference` answers (default: the first method's), and share answered by the small path.

    The methods answer each request in turn, in an order that alternates from one request to
    the next, so a drift of the machine's speed (other load, memory pressure) falls on all of
    them alike and their latency ratios stay comparable."""
    labels = list(methods)
    calls: dict[str, list] = {k: [] for k in labels}
    latencies: dict[str, list[float]] = {k: [] for k in labels}
    small = dict.fromkeys(labels, 0)
    for i, ex in enumerate(tqdm(examples, desc=desc, unit="req")):
        for label in (labels if i % 2 == 0 else labels[::-1]):
            start = time.perf_counter()
            answer = methods[label].answer([{"role": "user", "content": ex.query}], _tools(ex, library))
            latencies[label].append(time.perf_counter() - start)
            calls[label].append(answer.calls)
            small[label] += answer.details.get("path") == "small"
    reference = reference if reference is not None else calls[labels[0]]
    n = len(examples)
    out = {}
    for label in labels:
        out[label] = {"n": n, "share": small[label] / n,
                      "accuracy": sum(same_calls(c, ex.answers) for c, ex in zip(calls[label], examples)) / n,
                      "agreement": sum(same_calls(c, r) for c, r in zip(calls[label], reference)) / n,
                      "latency": _summary(latencies[label]), "latencies": latencies[label], "calls": calls[label]}
    return out


def ratios(m: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Latency of `m` against `base` measured side by side: ratio of means, ratio of medians, and
    the median of per-request ratios."""
    return {"mean": m["latency"]["mean"] / base["latency"]["mean"],
            "median": m["latency"]["median"] / base["latency"]["median"],
            "median_of_ratios": statistics.median(a / b for a, b in zip(m["latencies"], base["latencies"]))}


def run_odia_bench(cascade: Any, artifact: str | Path, direct: dict[str, Any], data: Sequence[str],
                   out: str | Path, config: OdiaBenchConfig, library: Sequence[Tool] | None = None) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stream, held = scenario(data, library, config)
    if len(stream) < config.cycle_every or not held:
        raise InputError(f"{len(stream)} stream and {len(held)} held-out requests: too few for this configuration")
    # The direct models answer the first held-out stretch only; the caller's references go too,
    # so they are freed after it (a 1.5B on llama.cpp beside the cascade and a distillation
    # child ran a 24 GiB machine out of memory).
    baselines = dict(direct)
    direct.clear()
    embedder = SharedEmbedder()
    if getattr(cascade, "gate", None) is not None:
        cascade.gate.share_embedder(embedder)  # one MiniLM and one tool-vector cache for every system here
    if library is not None:
        cascade.use_library(library)
        # The library does not fit a prompt: the large model answers over the tools the small
        # path's selector keeps (retrieve, then prompt), the baseline a user would build.
        selector = ToolSelector.load(config.cycle.selector or default_selector_dir(), embedder)
        baselines = {f"{label} over the selector's tools": PreselectedMethod(method, selector) for label, method in baselines.items()}
    store_path = out / "traffic.sqlite"
    for leftover in out.glob("traffic.sqlite*"):
        leftover.unlink()  # a fresh log: the simulation starts with no traffic
    versions = Versions(out / "odia")
    run_provenance = provenance([cascade, *baselines.values()])
    first = measure({"cascade": cascade, **baselines}, held, library, desc="held-out: cascade and direct")
    del baselines
    gc.collect()
    baseline = first.pop("cascade")
    reference = baseline.pop("calls")
    result: dict[str, Any] = {
        "config": {**asdict(config), "cycle": {**asdict(config.cycle), "gate": asdict(config.cycle.gate)}},
        "scenario": "library" if library is not None else "own-tools",
        "library_tools": len(library) if library is not None else None,
        "stream": len(stream), "held_out": len(held), "cascade": baseline, "direct": {}, "cycles": [],
        "command": list(sys.argv), "provenance": run_provenance,
    }
    for label, m in first.items():
        m.pop("calls")
        result["direct"][label] = m | {"vs_cascade": ratios(m, baseline)}
    log = TrafficLog(store_path, flush_interval=0.05)
    routed: RoutedMethod | None = None
    served = 0
    try:
        for start in range(0, len(stream), config.cycle_every):
            phase = stream[start:start + config.cycle_every]
            system = RecordedMethod(routed if routed is not None else cascade, log)
            paths = []
            for ex in tqdm(phase, desc=f"serving {start}-{start + len(phase)}", unit="req"):
                paths.append(system.answer([{"role": "user", "content": ex.query}], _tools(ex, library)).details.get("path"))
            served += len(phase)
            log.flush(timeout=60)
            with open_store(store_path) as store:
                report = run_cycle(store, versions, artifact, config.cycle, embedder)
            if report.status == "promoted":
                if routed is None:
                    routed = RoutedMethod.load(cascade, versions.root, config.cycle.engine, config.cycle.device,
                                               poll_seconds=0.0, embedder=embedder)
                    routed.explore = config.explore
                routed.wait_for(report.version, timeout=600)
            point: dict[str, Any] = {"served": served, "phase_small_share": paths.count("small") / len(paths),
                                     "status": report.status, "reasons": report.reasons, "version": report.version,
                                     "cycle_seconds": report.seconds, "window": report.window}
            if routed is not None:
                explore, routed.explore = routed.explore, 0.0  # measured as it serves, without exploration
                # The cascade again, side by side: only ratios measured in one stretch are compared.
                now = measure({"routed": routed, "cascade": cascade}, held, library, reference,
                              desc=f"held-out: routed and cascade after {served}")
                routed.explore = explore
                for m in now.values():
                    m.pop("calls")
                point["routed"] = now["routed"] | {"vs_cascade": ratios(now["routed"], now["cascade"])}
                point["cascade"] = now["cascade"]
            else:
                point["routed"] = {k: v for k, v in baseline.items()} | {"share": 0.0, "agreement": 1.0}
            result["cycles"].append(point)
            (out / "odia_bench.json").write_text(json.dumps(result, indent=2, default=str))  # progress so far
    finally:
        log.close()
    return result


def write_odia_report(result: dict, out: str | Path) -> dict[str, Path]:
    """odia_bench.json, odia_bench.md (one row per cycle) and odia_bench.png (share, agreement,
    accuracy and latency over the cycles, against the cascade and the direct large model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    paths = {"json": out / "odia_bench.json", "md": out / "odia_bench.md", "png": out / "odia_bench.png"}
    paths["json"].write_text(json.dumps(result, indent=2, default=str))
    cascade, cycles = result["cascade"], result["cycles"]
    ms = lambda m, key: f"{1000 * m['latency'][key]:.0f}"  # noqa: E731
    lines = [
        "# Learning from traffic: the routed system over cycles", "",
        f"Command: `{' '.join(result['command'])}`", "", provenance_markdown(result.get("provenance")), "",
        f"Scenario: {result['scenario']}" + (f" ({result['library_tools']} tools)" if result["library_tools"] else "")
        + f". {result['stream']} fc-train requests served (train split), a cycle every "
        f"{result['config']['cycle_every']}; measured on {result['held_out']} held-out requests (validation split). "
        "Agreement: same calls as the cascade; accuracy: same calls as gold. Latency: wall clock per request, ms.", "",
        "| system | served | cycle | small path % | agreement % | accuracy % | mean | median | p90 | ÷ cascade |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]

    def row(system: str, m: dict, served: Any = "", status: str = "") -> str:
        ratio = m.get("vs_cascade")
        versus = (f"{ratio['mean']:.2f} / {ratio['median']:.2f} / {ratio['median_of_ratios']:.2f}" if ratio else "")
        return (f"| {system} | {served} | {status} | {100 * m['share']:.1f} | {100 * m['agreement']:.1f} | "
                f"{100 * m['accuracy']:.1f} | {ms(m, 'mean')} | {ms(m, 'median')} | {ms(m, 'p90')} | {versus} |")

    lines.append(row("cascade alone", cascade))
    lines += [row(label, m) for label, m in result["direct"].items()]
    for point in cycles:
        lines.append(row("routed", point["routed"], point["served"], point["status"]))
        if "cascade" in point:
            lines.append(row("cascade, same stretch", point["cascade"], point["served"]))
    lines += ["", "÷ cascade: latency against the cascade measured side by side in the same stretch (each request "
              "answered by both in turn): ratio of means / ratio of medians / median of per-request ratios."]
    lines += ["", "Cycles:"] + [f"- after {p['served']}: {p['status']} {p['version'] or ''} ({p['cycle_seconds']:.0f} s): "
                                + "; ".join(p["reasons"]) for p in cycles]
    paths["md"].write_text("\n".join(lines) + "\n")

    served = [0] + [p["served"] for p in cycles]
    routed = [{"share": 0.0, "agreement": 1.0, "accuracy": cascade["accuracy"], "latency": cascade["latency"]}]
    routed += [p["routed"] for p in cycles]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(served, [100 * m["share"] for m in routed], "o-", label="share on the small path")
    left.plot(served, [100 * m["agreement"] for m in routed], "s-", label="agreement with the cascade")
    left.plot(served, [100 * m["accuracy"] for m in routed], "^-", label="accuracy (gold)")
    left.set_xlabel("requests served")
    left.set_ylabel("%")
    left.set_ylim(0, 105)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    cascades = [cascade] + [p.get("cascade", cascade) for p in cycles]  # re-measured beside the routed system
    for key, style in (("mean", "o-"), ("median", "s--")):
        right.plot(served, [1000 * m["latency"][key] for m in routed], style, label=f"routed, {key}")
        right.plot(served, [1000 * m["latency"][key] for m in cascades], style, color="gray", label=f"cascade, {key}")
        for label, m in result["direct"].items():
            right.axhline(1000 * m["latency"][key], color="red", linestyle=style[1:], label=f"{label}, {key}")
    right.set_xlabel("requests served")
    right.set_ylabel("ms per request")
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=120)
    plt.close(fig)
    return paths

