"""Set an off-topic gate's dismissal threshold (hyfunc/cascade/off_topic.py) from fc-train's call
requests, with no large model, and report what it dismisses: fc-train's call requests (which it
must not), the ChatterBot corpus's off-topic requests and hyfunc's held-out off-topic requests, each
shown the tools of a random fc-train call request (seeded). `hyfunc prepare` sets the threshold when it
trains a gate; this script sets it on a gate trained before it existed (the shipped one).

    python scripts/calibrate_dismissal.py --gate hyfunc/data/cascade/off_topic --out reports/dismissal/calibration.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from hyfunc.cascade.data import load_examples, off_topic_requests
from hyfunc.cascade.off_topic import OffTopicGate, calibrate_dismissal
from hyfunc.data import FC_TRAIN
from hyfunc.eval.provenance import provenance
from hyfunc.eval.refusal import held_out_off_topic


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", required=True, help="an off-topic gate directory: its manifest is rewritten")
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--max-false-dismissals", type=float, default=None, help="default: the gate's own setting")
    parser.add_argument("--out", required=True, help="the report (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    gate = OffTopicGate.load(args.gate)
    if args.max_false_dismissals is not None:
        gate.config.max_false_dismissals = args.max_false_dismissals
    calls = [ex for ex in load_examples(args.data) if ex.answers and ex.tools]
    dismissal = calibrate_dismissal(gate, calls)
    rng = random.Random(args.seed)
    sets = {"chatterbot": [ex.query for ex in off_topic_requests()], "held-out off-topic": held_out_off_topic()}
    for name, requests in sets.items():
        screened = [gate.screen(request, rng.choice(calls).tools) for request in requests]
        dismissal[name] = {"requests": len(requests),
                           **{verdict: screened.count(verdict) / len(requests) for verdict in ("dismissed", "suspected", "clear")}}
    gate.config.metrics = {**gate.config.metrics, "dismissal": dismissal}
    gate.save(args.gate)
    report = {"command": sys.argv, "provenance": provenance([]), "dismiss_threshold": gate.config.dismiss_threshold,
              "max_false_dismissals": gate.config.max_false_dismissals,
              "cosine_threshold": gate.config.cosine_threshold, "metrics": dismissal}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report["metrics"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
