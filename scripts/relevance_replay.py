"""Replay committed `hyfunc eval bfcl|ood` runs with the relevance check (hyfunc/cascade/relevance.py)
added: a case whose calls the check would refuse (no selected tool reaches the threshold) becomes
"no call". The rest of the cascade runs before the check and is unchanged by it, so the replay is exact:
no call is right on a relevance category and wrong on every call category.

    python scripts/relevance_replay.py --relevance artifacts/hyfunc-rel-loso/relevance \
      --run reports/ood/held-out/hyfunc_hyfunc-loso-sv/cases.jsonl=reports/ood/held-out/data \
      --run reports/schema-variants/llamacpp-n240/hyfunc@llamacpp/cases.jsonl \
      --out reports/relevance/replay-loso.json

`--run CASES[=DATA_DIR]`: a run's cases.jsonl and its BFCL-layout data (default: bfcl-eval's own).
Writes per run and category the right answers before and after at the model's threshold, and the
same over a grid of thresholds (the trade-off), plus every changed case with its score.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hyfunc.cascade.relevance import RelevanceModel
from hyfunc.eval.bfcl import is_relevance_category, load_cases
from hyfunc.eval.provenance import provenance
from hyfunc.formats.messages import conversation_text
from hyfunc.formats.schema import parse_tools


def replay(model: RelevanceModel, cases_path: Path, data_dir: str | None) -> list[dict]:
    records = [json.loads(line) for line in cases_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_id = {}
    for category in sorted({r["category"] for r in records}):
        by_id.update({c.id: c for c in load_cases(category, data_dir)})
    rows = []
    for r in records:
        retrieved = r.get("details", {}).get("retrieved") or []
        best = None
        if r["calls"] and retrieved:
            case = by_id[r["id"]]
            tools = {t.name: t for t in parse_tools(case.functions)}
            best = model.best(conversation_text(case.messages), [tools[n] for n in retrieved if n in tools])
        rows.append({"id": r["id"], "category": r["category"], "correct": r["correct"], "best": best})
    return rows


def verdict(row: dict, threshold: float) -> bool:
    if row["best"] is not None and row["best"] < threshold:
        return is_relevance_category(row["category"])
    return row["correct"]


def tally(rows: list[dict], threshold: float) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in rows:
        cell = out.setdefault(row["category"], [0, 0, 0])  # right before, right after, n
        cell[0] += row["correct"]
        cell[1] += verdict(row, threshold)
        cell[2] += 1
    return out


def plot(report: dict, path: Path) -> None:
    """Per run: relevance cases right and call cases right (% of each) against the threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, (name, run) in zip(axes[0], runs.items()):
        xs, relevance, calls = [], [], []
        for point in run["sweep"]:
            cells = point["by_category"].items()
            rel = [c for k, c in cells if is_relevance_category(k)]
            call = [c for k, c in cells if not is_relevance_category(k)]
            xs.append(point["threshold"])
            relevance.append(100 * sum(c[1] for c in rel) / max(1, sum(c[2] for c in rel)))
            calls.append(100 * sum(c[1] for c in call) / max(1, sum(c[2] for c in call)))
        ax.plot(xs, relevance, "o-", label="no-call cases right %")
        ax.plot(xs, calls, "s-", label="call cases right %")
        ax.axvline(report["threshold"], color="grey", linestyle="--", label="the model's threshold")
        ax.set_title(f"{Path(name).parent.parent.name}/{Path(name).parent.name}", fontsize=9)
        ax.set_xlabel("relevance threshold (logit)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relevance", required=True, type=Path)
    parser.add_argument("--run", action="append", required=True, help="CASES.jsonl[=DATA_DIR]")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    model = RelevanceModel.load(args.relevance)
    threshold = model.config.threshold
    report: dict = {"command": sys.argv, "provenance": provenance([]), "threshold": threshold,
                    "relevance_config": {k: v for k, v in vars(model.config).items()}, "runs": {}}
    for spec in args.run:
        cases, _, data_dir = spec.partition("=")
        rows = replay(model, Path(cases), data_dir or None)
        scored = sorted(r["best"] for r in rows if r["best"] is not None)
        grid = sorted({threshold, *np.quantile(scored, np.linspace(0, 0.5, 11)).tolist()}) if scored else [threshold]
        report["runs"][cases] = {
            "data_dir": data_dir or "bfcl-eval",
            "at_threshold": tally(rows, threshold),
            "sweep": [{"threshold": t, "by_category": tally(rows, t)} for t in grid],
            "changed": [r for r in rows if verdict(r, threshold) != r["correct"]],
            "rows": rows,
        }
        print(cases)
        for category, (before, after, n) in sorted(tally(rows, threshold).items()):
            print(f"  {category:24s} {before:3d} -> {after:3d} of {n}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    plot(report, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
