"""Cascades on agent conversations built from fc-train's validation split (never BFCL, never the
training split): after tool results, and at the opening of a chained request, is the next step right?

    python scripts/agent_step_validation.py --artifacts hyfunc/data/cascade artifacts/hyfunc-agent \
        --engine llamacpp --per-source 6 --out reports/agent-steps/validation.json

Conversations (`hyfunc/cascade/agent_steps.py`), from validation examples only:
- answer: every call made and answered -> right when no call is made (a text answer follows);
- calls left: the first k of n calls made -> exact when the calls made now are the ones left;
- chained opening: "A. Then B with the <value> it returns", nothing called yet -> exact when
  only A's calls are made;
- chained, after A's results (one holds B's value) -> exact when B's call is made with it;
- joined opening: two independent requests "A. Then B" (or "Also", a new line), nothing called
  yet -> exact when every call of both is made;
- follow-ups: request A done (calls, results, a text reply), then the user's next message:
  another request B of A's source, B's tools offered beside A's -> exact when B's calls are made;
  a request of another source, only A's tools offered, or small talk (hyfunc/data's held-out
  off-topic lines) -> right when no call is made. Rows keep the refusal head's answerabilities
  (`scripts/follow_up_rules.py` replays other rules on them).
Exact = `same_calls` (names and arguments after normalisation, any order). Every cascade answers
the same conversations, one after the other, on the same engine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from tqdm.auto import tqdm

from hyfunc.cascade.agent_steps import ANSWER, AgentStep, agent_steps, chained_steps, follow_ups, joined_openings
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.data import FC_TRAIN
from hyfunc.eval.provenance import provenance
from hyfunc.eval.refusal import held_out_off_topic
from hyfunc.formats.calls import Call, same_calls
from hyfunc.methods.cascade import HyFuncMethod


KINDS = ("answer", "calls_left", "chained_opening", "chained_after_results", "joined_opening",
         "follow_up", "follow_up_unrelated", "follow_up_small_talk")


def kind(step: AgentStep) -> str:
    if step.form.startswith("follow_up"):
        return step.form
    if step.label == ANSWER:
        return "answer"
    if not step.after_results:
        return f"{step.form}_opening"
    return "chained_after_results" if step.form == "chained" else "calls_left"


def right(step: AgentStep, calls: list[Call]) -> bool:
    if step.label == ANSWER:
        return not calls
    return same_calls(calls, [Call(c["name"], dict(c.get("arguments") or {})) for c in step.remaining])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--artifacts", nargs="+", required=True, help="cascade directories, side by side")
    parser.add_argument("--per-source", type=int, default=6, help="conversations of each label, and chained requests, per source")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="only these kinds of step")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    _, val = split_examples(load_examples(args.data))
    steps = agent_steps(val, args.per_source, args.seed) + chained_steps(val, args.per_source, args.seed)
    steps += joined_openings(val, args.per_source, args.seed) + follow_ups(val, args.per_source, held_out_off_topic(), args.seed)
    steps = [s for s in steps if kind(s) in args.kinds]
    methods = {}
    for path in args.artifacts:
        methods[path] = HyFuncMethod.load(path, large_engine=args.engine, small_engine=args.engine)
    rows = []
    for step in tqdm(steps, desc="agent steps", unit="conversation"):
        row = {"id": step.id, "source": step.source, "kind": kind(step), "gold": step.remaining}
        for label, method in methods.items():
            start = time.perf_counter()
            answer = method.answer(step.messages, step.tools)
            row[label] = {"right": right(step, answer.calls), "seconds": round(time.perf_counter() - start, 3),
                          "calls": [[c.name, c.arguments] for c in answer.calls],
                          "next_step": answer.details.get("next_step"),
                          **{k: answer.details[k] for k in ("answerability", "answerability_conversation", "refused_by")
                             if k in answer.details}}
        rows.append(row)
    summary = {}
    for label in methods:
        per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            per_kind[r["kind"]][0] += r[label]["right"]
            per_kind[r["kind"]][1] += 1
        summary[label] = {"right": sum(r[label]["right"] for r in rows), "n": len(rows),
                          "by_kind": {k: f"{a}/{n}" for k, (a, n) in sorted(per_kind.items())},
                          "median_seconds": statistics.median(r[label]["seconds"] for r in rows)}
    result = {"command": sys.argv, "provenance": provenance(list(methods.values())),
              "kinds": dict(Counter(r["kind"] for r in rows)), "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
    print(json.dumps({"kinds": result["kinds"], "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
