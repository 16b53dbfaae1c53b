"""Issue 49: what the refusal threshold would have to be for a target irrelevance, and what it costs.

The cascade refuses a first request when the retriever's answerability is below its threshold
(`details.answerability` in a run's cases.jsonl). From the no-call cases of one run, the lowest
threshold that refuses the target share of them; then, in a run with call cases, how many right
calls fall below it (each would become a refusal). Exact for the refusal decision; the gate's
dismissals (no answerability recorded) stay refusals.

    python scripts/refusal_threshold_tradeoff.py --no-call reports/bfcl-n100/irrelevance/cases.jsonl \
      --calls reports/schema-variants/llamacpp-n240/hyfunc@llamacpp/cases.jsonl --target 0.9
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def no_call(row: dict) -> bool:
    return "irrelevance" in row["category"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-call", required=True, help="cases.jsonl whose no-call cases set the threshold")
    parser.add_argument("--calls", required=True, help="cases.jsonl whose right call answers are counted")
    parser.add_argument("--target", type=float, default=0.9, help="share of no-call cases refused")
    args = parser.parse_args()
    cases = [r for r in rows(args.no_call) if no_call(r)]
    refused = sum(not r["calls"] for r in cases)
    called = sorted(r["details"]["answerability"] for r in cases if r["calls"])
    needed = math.ceil(args.target * len(cases)) - refused
    if needed <= 0:
        print(f"{refused} / {len(cases)} no-call cases refused already: the target is met")
        return 0
    threshold = called[needed - 1] + 1e-6 if needed <= len(called) else math.inf
    right = [r["details"]["answerability"] for r in rows(args.calls)
             if r["correct"] and not no_call(r) and r["calls"] and r["details"].get("answerability") is not None]
    lost = sum(a < threshold for a in right)
    print(f"no-call cases: {len(cases)}, refused {refused}; {needed} more to refuse for {args.target:.0%}: "
          f"answerability threshold {threshold:.2f}")
    print(f"right call answers in {args.calls}: {len(right)}; below that threshold (would be refused): {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
