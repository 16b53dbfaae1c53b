"""How each turn of a BFCL multi-turn run began, from its cases.jsonl: the first step of every
turn called or made no call, and why (the retriever's "no tool fits", the off-topic gate), for a
conversation's first turn apart from its follow-up turns; and, in a run with
`CascadeOptions.follow_up_alone`, the follow-ups called where the conversation's answerability was
below the refusal threshold (refused before: no call).

    python scripts/multi_turn_first_steps.py reports/bfcl-multi-turn/<run>/hyfunc@llamacpp/cases.jsonl ...
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from hyfunc.methods.cascade import DEFAULT_ARTIFACT


def first_steps(path: Path, threshold: float) -> dict[str, Counter]:
    counts = {"first turn": Counter(), "follow-up turn": Counter()}
    for line in path.read_text().splitlines():
        case = json.loads(line)
        for index, turn in enumerate(case["turns"]):
            which = counts["first turn" if index == 0 else "follow-up turn"]
            which["turns"] += 1
            if not turn:
                which["no step"] += 1
                continue
            step = turn[0]
            details = step.get("details") or {}
            if step.get("calls"):
                which["called"] += 1
                which["called, the conversation's answerability below the threshold"] += (
                    details.get("answerability_conversation", threshold) < threshold)
            elif details.get("refused_by"):
                which[f"no call: {details['refused_by']}"] += 1
            elif "answerability" in details:
                which["no call: no tool fits"] += 1
            else:
                which["no call: other"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", type=Path, help="cases.jsonl of a cascade's multi-turn run")
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="the cascade that ran (its refusal threshold)")
    args = parser.parse_args()
    manifest = json.loads((args.artifact / "retriever" / "manifest.json").read_text())
    threshold = manifest["config"]["refusal_threshold"]
    print(json.dumps({str(p): {k: dict(v) for k, v in first_steps(p, threshold).items()} for p in args.cases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
