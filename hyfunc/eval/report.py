"""Aggregate BFCL case records into results.json / results.md / accuracy_latency.png, and merge
several runs (methods) into one side-by-side comparison."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from hyfunc.cascade.retriever import exact_set_accuracy, recall_at_k, refusal_accuracy
from hyfunc.errors import InputError
from hyfunc.eval.bfcl_multi_turn import conversation_figures, conversation_markdown
from hyfunc.eval.plots import pyplot
from hyfunc.eval.provenance import provenance_markdown
from hyfunc.eval.records import read_case_records

OVERALL = "overall"


def _stats(records: list[dict]) -> dict[str, Any]:
    n = len(records)
    if n == 0:
        return {"n": 0, "correct": 0, "accuracy": None, "latency_mean": None, "latency_median": None,
                "latency_p90": None, "input_tokens_mean": None, "output_tokens_mean": None}
    lat = [float(r.get("latency") or 0.0) for r in records]
    correct = sum(1 for r in records if r.get("correct"))
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n,
        "latency_mean": statistics.fmean(lat),
        "latency_median": statistics.median(lat),
        "latency_p90": float(np.percentile(lat, 90)),
        "input_tokens_mean": statistics.fmean(float(r.get("input_tokens") or 0) for r in records),
        "output_tokens_mean": statistics.fmean(float(r.get("output_tokens") or 0) for r in records),
        "errors": sum(1 for r in records if r.get("model_error")),
    }


def summarize(records: Iterable[dict], categories: Sequence[str] | None = None) -> dict:
    """Per-category and overall statistics.

    ``overall`` pools every case (micro average); ``category_mean_accuracy`` is the unweighted mean
    of the per-category accuracies. Neither is BFCL's leaderboard "overall" (which weights groups of
    categories differently and includes categories we do not run).
    """
    records = list(records)
    cats = list(categories) if categories else sorted({r["category"] for r in records})
    per_cat = {c: _stats([r for r in records if r["category"] == c]) for c in cats}
    accs = [s["accuracy"] for s in per_cat.values() if s["accuracy"] is not None]
    kept = [r for r in records if r["category"] in per_cat]
    return {
        "categories": per_cat,
        OVERALL: _stats(kept),
        "category_mean_accuracy": statistics.fmean(accs) if accs else None,
        # cascade runs only (None otherwise): what the templating injected, what the retriever chose
        "generated_tokens": generated_share(kept),
        "retrieval": retrieval_metrics(kept),
        "multi_turn": conversation_figures(kept),  # how conversations went (multi-turn categories only)
    }


# ---------------------------------------------------------------------------------------------
# Writing


def _fmt(x: Any, kind: str) -> str:
    if x is None:
        return "–"
    if kind == "pct":
        return f"{100 * x:.1f}"
    if kind == "s":
        return f"{x:.3f}"
    if kind == "tok":
        return f"{x:.0f}"
    return str(x)


_COLUMNS = [
    ("n", "n", ""),
    ("accuracy", "acc %", "pct"),
    ("latency_mean", "lat mean s", "s"),
    ("latency_median", "lat median s", "s"),
    ("latency_p90", "lat p90 s", "s"),
    ("input_tokens_mean", "in tok", "tok"),
    ("output_tokens_mean", "out tok", "tok"),
]


def markdown_table(summary: dict) -> str:
    head = "| category | " + " | ".join(c[1] for c in _COLUMNS) + " |"
    sep = "|---|" + "|".join("---:" for _ in _COLUMNS) + "|"
    rows = [head, sep]
    for cat, s in list(summary["categories"].items()) + [(OVERALL, summary[OVERALL])]:
        name = f"**{cat}**" if cat == OVERALL else cat
        rows.append(f"| {name} | " + " | ".join(_fmt(s.get(k), kind) for k, _, kind in _COLUMNS) + " |")
    return "\n".join(rows)


def write_reports(summary: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "md": out / "results.md", "png": out / "accuracy_latency.png"}
    paths["json"].write_text(json.dumps(summary, indent=2, ensure_ascii=False, default=repr) + "\n", encoding="utf-8")
    meta = summary.get("meta", {})
    lines = [f"# BFCL results: {meta.get('method', '?')}", ""]
    if meta:
        lines += [
            f"- command: `{' '.join(meta.get('command', []))}`",
            f"- date: {meta.get('date')}",
            f"- hyfunc {meta.get('hyfunc_version')}, bfcl-eval {meta.get('bfcl_eval_version')} (official AST checker)",
            f"- limit per category: {meta.get('limit')}",
            f"- {provenance_markdown(meta.get('provenance'))}",
            "",
        ]
    lines += [markdown_table(summary), ""]
    cm = summary.get("category_mean_accuracy")
    if cm is not None:
        lines += [f"Unweighted mean of category accuracies: {100 * cm:.1f} %. "
                  "Latency is wall-clock per case, seconds.", ""]
    if summary.get("multi_turn"):
        lines += ["Multi-turn conversations (bfcl-eval's error types for the failures):", "",
                  *conversation_markdown(summary["multi_turn"]), ""]
    cascade = {k: summary[k] for k in ("generated_tokens", "retrieval") if summary.get(k)}
    if cascade:
        lines += _analysis_markdown({meta.get("method", "method"): cascade}, None) + [""]
    paths["md"].write_text("\n".join(lines), encoding="utf-8")
    plot_accuracy_latency({meta.get("method", "method"): summary}, paths["png"])
    return paths


def plot_accuracy_latency(summaries: dict[str, dict], path: str | Path) -> Path:
    """Accuracy vs median latency: one point per (method, category), overall as a big marker."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (method, summary) in enumerate(summaries.items()):
        color = colors[i % len(colors)]
        xs, ys, labels = [], [], []
        for cat, s in summary["categories"].items():
            if s.get("accuracy") is None:
                continue
            xs.append(s["latency_median"])
            ys.append(100 * s["accuracy"])
            labels.append(cat)
        ax.scatter(xs, ys, color=color, alpha=0.7, s=30)
        for x, y, label in zip(xs, ys, labels):
            ax.annotate(label, (x, y), fontsize=7, alpha=0.8, xytext=(3, 3), textcoords="offset points")
        o = summary[OVERALL]
        if o.get("accuracy") is not None:
            ax.scatter([o["latency_median"]], [100 * o["accuracy"]], color=color, marker="*", s=250,
                       edgecolor="black", label=f"{method} (overall)")
    ax.set_xlabel("median latency per case (s)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("BFCL (official checker): accuracy vs latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------------
# Comparing runs


def load_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8"))


def _paired_ratio(records: list[dict], baseline: list[dict]) -> dict[str, Any] | None:
    """Latency of `records` relative to `baseline` on the cases both answered."""
    base = {r["id"]: float(r.get("latency") or 0.0) for r in baseline}
    pairs = [(float(r.get("latency") or 0.0), base[r["id"]]) for r in records if r["id"] in base]
    if not pairs or not all(b > 0 for _, b in pairs):
        return None
    mine, theirs = zip(*pairs)
    return {
        "n": len(pairs),
        "ratio_of_means": statistics.fmean(mine) / statistics.fmean(theirs),
        "ratio_of_medians": statistics.median(mine) / statistics.median(theirs),
        "median_of_case_ratios": statistics.median(m / b for m, b in pairs),
    }


def prefill_decode(records: list[dict]) -> dict[str, float] | None:
    """Mean prefill P and decode D of a direct-prompting run (its `timings`)."""
    timed = [r["timings"] for r in records if "prefill" in r.get("timings", {})]
    if not timed:
        return None
    return {"n": len(timed), "P": statistics.fmean(t["prefill"] for t in timed),
            "D": statistics.fmean(t.get("decode", 0.0) for t in timed)}


def generated_share(records: list[dict]) -> dict[str, Any] | None:
    """Tokens the model generated / all tokens of the emitted calls (generated + injected)."""
    if not any(r.get("injected_tokens") for r in records):
        return None
    generated = sum(int(r.get("output_tokens") or 0) for r in records)
    injected = sum(int(r.get("injected_tokens") or 0) for r in records)
    return {"generated": generated, "injected": injected, "share": generated / max(generated + injected, 1)}


def retrieval_metrics(records: list[dict], ks: Sequence[int] = (1, 3, 5)) -> dict[str, dict] | None:
    """Per category, the cascade's retrieval against the ground truth's function names: recall@k,
    exact-set accuracy and, for the irrelevance categories, refusal accuracy; in every category the
    share refused (no tool selected: false refusals where a call was due)."""
    with_ranking = [r for r in records if "ranking" in (r.get("details") or {})]
    if not with_ranking:
        return None
    out = {}
    for cat in dict.fromkeys(r["category"] for r in with_ranking):
        ranked, gold, selected = [], [], []
        for r in (r for r in with_ranking if r["category"] == cat):
            position = {name: i for i, name in enumerate(r["details"]["ranking"])}
            ranked.append(list(range(len(position))))
            gold.append(sorted({position[n] for n in r.get("gold_functions") or [] if n in position}))
            selected.append([position[n] for n in r["details"]["retrieved"]])
        metrics: dict[str, Any] = {"n": len(ranked), "refused": sum(not s for s in selected) / len(selected)}
        if any(gold):
            metrics.update({f"recall@{k}": recall_at_k(ranked, gold, k) for k in ks})
            metrics["exact_set_accuracy"] = exact_set_accuracy(selected, gold)
        else:
            metrics["refusal_accuracy"] = refusal_accuracy(selected, gold)
        out[cat] = metrics
    return out


def side_by_side_analysis(records: dict[str, list[dict]], baseline: str | None = None) -> dict[str, dict]:
    """Per method: latency ratio to `baseline` (paired by case), the cascade-vs-P+D test against the
    baseline's prefill/decode split, generated-token share, retrieval metrics."""
    base = records.get(baseline) if baseline else None
    pd = prefill_decode(base) if base else None
    out = {}
    for label, recs in records.items():
        a: dict[str, Any] = {}
        if base is not None and label != baseline:
            a["latency_vs_baseline"] = _paired_ratio(recs, base)
            if pd is not None and recs:
                mean = statistics.fmean(float(r.get("latency") or 0.0) for r in recs)
                target = pd["P"] + 0.15 * pd["D"]
                a["vs_prefill_decode"] = {"latency_mean": mean, "P": pd["P"], "D": pd["D"], "P+0.15D": target,
                                          "met": mean <= target, "excess_over_P_in_D": (mean - pd["P"]) / pd["D"] if pd["D"] else None}
        a["generated_tokens"] = generated_share(recs)
        a["retrieval"] = retrieval_metrics(recs)
        out[label] = a
    return out


def _analysis_markdown(analysis: dict[str, dict], baseline: str | None) -> list[str]:
    lines = []
    if baseline:
        lines += ["", f"## Latency against {baseline} (paired by case)", "",
                  "| method | n | mean ratio | median ratio | median of case ratios | mean s | P + 0.15·D s | met |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for label, a in analysis.items():
            r, v = a.get("latency_vs_baseline"), a.get("vs_prefill_decode")
            if not r:
                continue
            cells = [str(r["n"]), f"{r['ratio_of_means']:.2f}", f"{r['ratio_of_medians']:.2f}", f"{r['median_of_case_ratios']:.2f}"]
            cells += [f"{v['latency_mean']:.2f}", f"{v['P+0.15D']:.2f}", "yes" if v["met"] else "no"] if v else ["–"] * 3
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        pd = next((a["vs_prefill_decode"] for a in analysis.values() if a.get("vs_prefill_decode")), None)
        if pd:
            lines += ["", f"{baseline}: mean prefill P = {pd['P']:.2f} s, mean decode D = {pd['D']:.2f} s per case."]
    shares = {label: a["generated_tokens"] for label, a in analysis.items() if a.get("generated_tokens")}
    if shares:
        lines += ["", "## Generated vs injected tokens of the emitted calls", "",
                  "| method | generated | injected | generated share |", "|---|---:|---:|---:|"]
        lines += [f"| {label} | {g['generated']} | {g['injected']} | {100 * g['share']:.1f} % |" for label, g in shares.items()]
    retrieval = next(((label, a["retrieval"]) for label, a in analysis.items() if a.get("retrieval")), None)
    if retrieval:
        label, per_cat = retrieval
        keys = ["recall@1", "recall@3", "recall@5", "exact_set_accuracy", "refusal_accuracy", "refused"]
        lines += ["", f"## Retrieval on BFCL ({label}; gold = the ground truth's function names)", "",
                  "| category | n | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
        for cat, m in per_cat.items():
            lines.append(f"| {cat} | {m['n']} | " + " | ".join(_fmt(m.get(k), "pct") for k in keys) + " |")
    return lines


def compare_runs(
    run_dirs: Sequence[str | Path], out_dir: str | Path, names: Sequence[str] | None = None, baseline: str | None = None
) -> dict[str, Path]:
    """Merge several runs into comparison.{json,md,png} in `out_dir`.

    Methods are columns of accuracy (and median latency) per category. Runs with identical method
    names are disambiguated by their folder name. With `baseline` (a method name), latency ratios,
    the prefill/decode test, token shares and retrieval metrics are added (see side_by_side_analysis).
    """

    summaries: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    for i, d in enumerate(run_dirs):
        s = load_summary(d)
        name = names[i] if names else s.get("meta", {}).get("method", Path(d).name)
        if name in summaries:
            name = f"{name} ({Path(d).name})"
        summaries[name] = s
        records[name] = read_case_records(d)
    if baseline is not None and baseline not in summaries:
        raise InputError(f"baseline {baseline!r} is not among the runs: {', '.join(summaries)}")
    cats: list[str] = []
    for s in summaries.values():
        for c in s["categories"]:
            if c not in cats:
                cats.append(c)
    methods = list(summaries)
    head = "| category | " + " | ".join(f"{m} acc % | {m} median s" for m in methods) + " |"
    sep = "|---|" + "|".join("---:|---:" for _ in methods) + "|"
    rows = [head, sep]
    for c in cats + [OVERALL]:
        cells = []
        for m in methods:
            s = summaries[m][OVERALL] if c == OVERALL else summaries[m]["categories"].get(c, {})
            n = s.get("n")
            cells.append(f"{_fmt(s.get('accuracy'), 'pct')} (n={n})" if n else "–")
            cells.append(_fmt(s.get("latency_median"), "s"))
        rows.append(f"| {'**overall**' if c == OVERALL else c} | " + " | ".join(cells) + " |")
    analysis = side_by_side_analysis(records, baseline)
    rows += _analysis_markdown(analysis, baseline)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "comparison.json", "md": out / "comparison.md", "png": out / "comparison.png"}
    paths["json"].write_text(json.dumps({"runs": {m: str(d) for m, d in zip(methods, run_dirs)}, "baseline": baseline,
                                         "summaries": summaries, "analysis": analysis}, indent=2, default=repr) + "\n",
                             encoding="utf-8")
    command = f"Command: `{' '.join(sys.argv)}`\n\n" if sys.argv and sys.argv[0].endswith("hyfunc") else ""
    paths["md"].write_text("# BFCL comparison (official checker)\n\n" + command + "\n".join(rows) + "\n", encoding="utf-8")
    plot_accuracy_latency(summaries, paths["png"])
    return paths

