"""How often the shipped off-topic gate dismisses a request on MiniLM alone (no large-model pass), on requests
it never saw: AgentDojo's user tasks with their suite's tools (third-party call requests: every dismissal is
wrong), the held-out small talk next to those tools (every dismissal is right), and, for the record only,
the user turns of BFCL's multi-turn categories with their APIs (the test set: read, never chosen on).

The gate reads a first request and, since `follow_up_alone`, a follow-up's new message the same way, so
these rates hold for both. Each row: the best MiniLM cosine between the text and the offered tools, and
the gate's verdict (dismissed / suspected / clear) at the shipped thresholds.

    python scripts/gate_dismissals.py --bfcl multi_turn_base --out reports/follow-ups/gate-dismissals.json
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from hyfunc.cascade.off_topic import GATE_DIR, OffTopicGate
from hyfunc.data import DATA_DIR
from hyfunc.eval.provenance import provenance
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import DEFAULT_ARTIFACT


def _rows(gate: OffTopicGate, kind: str, items: list[tuple[str, str, list]]) -> list[dict]:
    rows = []
    for item_id, text, tools in items:
        rows.append({"kind": kind, "id": item_id, "text": text, "tools": len(tools),
                     "best_cosine": round(gate.best_cosine(text, tools), 4), "verdict": gate.screen(text, tools)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", default=str(DEFAULT_ARTIFACT))
    parser.add_argument("--bfcl", nargs="*", default=[], help="BFCL multi-turn categories whose user turns to screen")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    gate = OffTopicGate.load(Path(args.artifact) / GATE_DIR)
    tasks = [json.loads(line) for line in (DATA_DIR / "ood" / "agentdojo.jsonl").read_text().splitlines() if line.strip()]
    suites: dict[str, list] = {}
    for task in tasks:
        suites.setdefault(task["id"].split("-")[1], parse_tools(task["tools"]))
    rows = _rows(gate, "agentdojo_task", [(t["id"], t["query"], parse_tools(t["tools"])) for t in tasks])
    small_talk = [line.strip() for line in (DATA_DIR / "off_topic_heldout.txt").read_text().splitlines() if line.strip()]
    rows += _rows(gate, "small_talk", [(f"{suite}-{i}", text, tools) for suite, tools in sorted(suites.items())
                                       for i, text in enumerate(small_talk)])
    if args.bfcl:
        from hyfunc.eval.bfcl_multi_turn import load_multi_turn_cases

        for category in args.bfcl:
            for case in load_multi_turn_cases(category):
                tools = parse_tools(case.functions)
                turns = [(f"{case.id}-{t}", m["content"], tools) for t, turn in enumerate(case.turns)
                         for m in turn if m.get("role") == "user"]
                rows += _rows(gate, f"bfcl_{category}", turns)
    summary = {kind: dict(Counter(r["verdict"] for r in rows if r["kind"] == kind)) | {"n": sum(r["kind"] == kind for r in rows)}
               for kind in dict.fromkeys(r["kind"] for r in rows)}
    thresholds = {"dismiss_threshold": gate.config.dismiss_threshold, "cosine_threshold": gate.config.cosine_threshold}
    out = {"command": sys.argv, "provenance": provenance(), "thresholds": thresholds, "summary": summary, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"thresholds": thresholds, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
