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
- both: the conversation's and the new message's;
- new message, gated: the new message's, after the off-topic gate has read the new message too
  (the run's gate read the transcript, which it never refused): dismissed, or suspected and
  confirmed by the gate's head on the conversation's soft token -> no call.

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
    parser.add_argument("--out", type=Path, required=True, help="JSON; the plot beside it (.png)")
    parser.add_argument("--replot", action="store_true", help="only draw the plot of an earlier --out")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.out.read_text())["summary"], args.out.with_suffix(".png"))
        return 0
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
        screened = method.gate.screen(follow_up_alone(step.messages)[-1]["content"], step.tools)
        if screened == "suspected":
            screened = "dismissed" if method.gate.confirms(method.encoder.encode(step.messages, step.tools).soft_token) else "clear"
        gold = [Call(c["name"], dict(c.get("arguments") or {})) for c in step.remaining]
        calls = [Call(name, arguments) for name, arguments in ran["calls"]]
        decided = {}
        for rule, calls_if in RULES.items():
            made = calls if calls_if(conversation, alone, threshold) else []
            decided[rule] = same_calls(made, gold) if gold else not made
        made = calls if screened == "clear" and alone >= threshold else []
        decided["new message, gated"] = same_calls(made, gold) if gold else not made
        rows.append({"id": row["id"], "kind": row["kind"], "source": row["source"], "conversation": conversation,
                     "new_message": round(alone, 4), "gate_on_new_message": screened, "right": decided})
    summary = {rule: {kind: f"{sum(r['right'][rule] for r in rows if r['kind'] == kind)}/{sum(r['kind'] == kind for r in rows)}"
                      for kind in sorted({r["kind"] for r in rows})} | {"all": f"{sum(r['right'][rule] for r in rows)}/{len(rows)}"}
               for rule in [*RULES, "new message, gated"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": sys.argv, "run": str(args.run), "provenance": provenance([method]),
                                    "threshold": threshold, "summary": summary, "rows": rows}, indent=1))
    plot(summary, args.out.with_suffix(".png"))
    print(json.dumps(summary, indent=1))
    return 0


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in next(iter(summary.values())) if k != "all"] + ["all"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(summary)
    for i, (rule, by_kind) in enumerate(summary.items()):
        shares = [100 * int(by_kind[k].split("/")[0]) / int(by_kind[k].split("/")[1]) for k in kinds]
        ax.bar([x + i * width for x in range(len(kinds))], shares, width, label=rule)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(kinds))], [k.replace("follow_up_", "") for k in kinds])
    ax.set_ylabel("right, %")
    ax.set_title("follow-up turns: 'no tool fits' decided on ...")
    ax.legend(fontsize=8, ncols=5, loc="lower center", bbox_to_anchor=(0.5, 1.08))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
