"""Which "no tool fits" rule for a follow-up turn, replayed exactly on a follow-up validation run
(`scripts/agent_step_validation.py --kinds follow_up follow_up_unrelated follow_up_small_talk`)
made where the cascade called whenever either pass found a tool fits (the code of commit f6fa0f5:
`answerability_follow_up` in a row where the conversation's refused), so that its calls are what
any rule that calls would write.

The refusal head's answerability of the new message alone is computed for every conversation
(the run has it only where the conversation's refused); then each rule decides call or no call:
- conversation: the conversation's answerability (the cascade before `follow_up_alone`);
- either: the conversation's or the new message's (as run);
- new message: the new message's alone;
- both: the conversation's and the new message's.

    python scripts/follow_up_rules.py --run reports/follow-ups/validation.json --per-source 5 \
        --engine llamacpp --out reports/follow-ups/rules.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from hyfunc.cascade.agent_steps import follow_ups
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.data import FC_TRAIN
from hyfunc.eval.provenance import provenance
from hyfunc.eval.refusal import held_out_off_topic
from hyfunc.formats.calls import Call, same_calls
from hyfunc.formats.messages import follow_up_alone
from hyfunc.methods.cascade import HyFuncMethod

RULES = {
    "conversation": lambda conversation, alone, t: conversation >= t,
    "either": lambda conversation, alone, t: max(conversation, alone) >= t,
    "new message": lambda conversation, alone, t: alone >= t,
    "both": lambda conversation, alone, t: min(conversation, alone) >= t,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--per-source", type=int, required=True, help="the run's --per-source")
    parser.add_argument("--seed", type=int, default=0, help="the run's --seed")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run = json.loads(args.run.read_text())
    [artifact] = run["summary"]
    _, val = split_examples(load_examples([str(FC_TRAIN)]))
    steps = {s.id: s for s in follow_ups(val, args.per_source, held_out_off_topic(), args.seed)}
    method = HyFuncMethod.load(artifact, large_engine=args.engine, small_engine=args.engine)
    threshold = method.retriever.config.refusal_threshold
    rows = []
    for row in tqdm(run["rows"], desc="new messages alone", unit="conversation"):
        step, ran = steps[row["id"]], row[artifact]
        alone = ran.get("answerability_follow_up")
        if alone is None:  # the run's conversation was answerable: the new message was not read alone
            alone = method._answerability(follow_up_alone(step.messages), step.tools, method.retriever)[0]
        conversation = ran.get("answerability_conversation", ran.get("answerability"))
        if conversation is None:  # dismissed by the off-topic gate before any large-model pass
            conversation = alone = float("-inf")
        gold = [Call(c["name"], dict(c.get("arguments") or {})) for c in step.remaining]
        calls = [Call(name, arguments) for name, arguments in ran["calls"]]
        decided = {}
        for rule, calls_if in RULES.items():
            made = calls if calls_if(conversation, alone, threshold) else []
            decided[rule] = same_calls(made, gold) if gold else not made
        rows.append({"id": row["id"], "kind": row["kind"], "source": row["source"], "conversation": conversation,
                     "new_message": round(alone, 4), "right": decided})
    summary = {rule: {kind: f"{sum(r['right'][rule] for r in rows if r['kind'] == kind)}/{sum(r['kind'] == kind for r in rows)}"
                      for kind in sorted({r["kind"] for r in rows})} | {"all": f"{sum(r['right'][rule] for r in rows)}/{len(rows)}"}
               for rule in RULES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": sys.argv, "run": str(args.run), "provenance": provenance([method]),
                                    "threshold": threshold, "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
