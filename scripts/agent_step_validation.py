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

`--agentdojo`: AgentDojo's conversations instead (third-party tools, real results;
hyfunc/eval/agentdojo_steps.py says what is right), up to `--per-source` of each kind per suite;
`--with-direct MODEL` adds direct prompting beside the cascades, `--ablations STAGE` the first cascade
with a stage off. Each suite's tools are fixed as a library, read once, as `hyfunc serve` does for an
agent's tools:

    python scripts/agent_step_validation.py --agentdojo --artifacts hyfunc/data/cascade \
        --with-direct qwen-coder-1.5b --engine llamacpp --per-source 3 \
        --out reports/agent-steps/agentdojo/shipped-vs-direct.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

from tqdm.auto import tqdm

from hyfunc.cascade.agent_steps import ANSWER, AgentStep, agent_steps, chained_steps, follow_ups, joined_openings
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.data import FC_TRAIN
from hyfunc.eval import agentdojo_steps
from hyfunc.eval.bfcl_multi_turn import fix_library
from hyfunc.eval.ood import value_kinds
from hyfunc.eval.plots import pyplot
from hyfunc.eval.provenance import provenance
from hyfunc.eval.refusal import held_out_off_topic
from hyfunc.formats.calls import Call, same_calls
from hyfunc.methods import load_method
from hyfunc.methods.cascade import CascadeOptions, HyFuncMethod


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


def agentdojo(per_source: int, seed: int) -> list[AgentStep]:
    """Up to `per_source` steps of each kind per suite, sampled, grouped by suite (one library each)."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[AgentStep]] = defaultdict(list)
    for step in agentdojo_steps.load_agentdojo_steps():
        groups[(step.source, agentdojo_steps.step_kind(step))].append(step)
    return [s for key in sorted(groups) for s in rng.sample(groups[key], min(per_source, len(groups[key])))]


def gold_kinds(step: AgentStep) -> list[str]:
    """The kinds of value the gold next calls hold (bool, enum, list, ...: hyfunc/eval/ood.py)."""
    schemas = {t.name: t.parameters.get("properties", {}) for t in step.tools}
    return sorted({k for c in step.remaining for name, v in (c.get("arguments") or {}).items()
                   for k in value_kinds(v, schemas.get(c["name"], {}).get(name, {}))})


def write(args: argparse.Namespace, methods: dict, rows: list[dict]) -> dict:
    """The summary of `rows` per method, written with them to `args.out`: right per kind, and the
    answer-or-call decision after tool results (a call due or not, whichever calls)."""
    summary = {}
    decided = [r for r in rows if r["kind"] in ("answer", "calls_left", "chained_after_results")]
    for label in methods:
        per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            per_kind[r["kind"]][0] += r[label]["right"]
            per_kind[r["kind"]][1] += 1
            for value_kind in r.get("gold_kinds", []) if r["kind"] != "answer" else []:
                per_kind[f"value:{value_kind}"][0] += r[label]["right"]
                per_kind[f"value:{value_kind}"][1] += 1
        decided_right = sum((r[label]["decision"] == "answer") == (r["kind"] == "answer") for r in decided)
        summary[label] = {"right": sum(r[label]["right"] for r in rows), "n": len(rows),
                          "by_kind": {k: f"{a}/{n}" for k, (a, n) in sorted(per_kind.items())},
                          "decision_after_results": f"{decided_right}/{len(decided)}",
                          "median_seconds": statistics.median(r[label]["seconds"] for r in rows)}
    result = {"command": sys.argv, "provenance": provenance(list(methods.values())),
              "kinds": dict(Counter(r["kind"] for r in rows)), "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
    return summary


def plot(summary: dict, path: Path) -> None:
    """Right per kind of step (and the decision after results), one bar per method."""
    plt = pyplot()

    def share(cell: str) -> float:
        right, n = (int(x) for x in cell.split("/"))
        return 100 * right / n if n else 0.0

    first = next(iter(summary.values()))
    kinds = [k for k in first["by_kind"] if not k.startswith("value:")]
    columns = kinds + (["decision after results"] if int(first["decision_after_results"].split("/")[1]) else [])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(columns)), 3.6))
    width = 0.8 / len(summary)
    for i, (label, s) in enumerate(summary.items()):
        cells = [s["by_kind"][k] for k in kinds] + [s["decision_after_results"]] * (len(columns) - len(kinds))
        ax.bar([x + i * width for x in range(len(columns))], [share(c) for c in cells], width, label=label)
    names = [textwrap.fill(c.replace("_", " "), 12) for c in columns]
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(columns))], names, fontsize=8)
    ax.set_ylabel("right, %")
    ax.set_ylim(0, 130)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--artifacts", nargs="+", required=True, help="cascade directories, side by side")
    parser.add_argument("--per-source", type=int, default=6, help="conversations of each label, and chained requests, per source")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="only these kinds of step")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--agentdojo", action="store_true", help="AgentDojo's conversations instead of fc-train's")
    parser.add_argument("--ablations", nargs="*", default=[], metavar="STAGE",
                        help="the first cascade with this stage off too (sharing its large-model pass); a+b: both off")
    parser.add_argument("--with-direct", nargs="*", default=[], metavar="MODEL", help="direct prompting of these models too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON; the plot beside it (.png)")
    parser.add_argument("--replot", action="store_true", help="only draw the plot of an earlier --out")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(Path(args.out).read_text())["summary"], Path(args.out).with_suffix(".png"))
        return 0

    if args.agentdojo:
        steps = agentdojo(args.per_source, args.seed)
        step_kind, step_right = agentdojo_steps.step_kind, agentdojo_steps.right
    else:
        _, val = split_examples(load_examples(args.data))
        steps = agent_steps(val, args.per_source, args.seed) + chained_steps(val, args.per_source, args.seed)
        steps += joined_openings(val, args.per_source, args.seed) + follow_ups(val, args.per_source, held_out_off_topic(), args.seed)
        step_kind, step_right = kind, right
    steps = [s for s in steps if step_kind(s) in args.kinds]
    if not steps:
        parser.error("no conversation of these kinds")
    methods = {}
    for path in args.artifacts:
        methods[path] = HyFuncMethod.load(path, large_engine=args.engine, small_engine=args.engine)
    first = next(iter(methods.values()))
    variants = {f"{args.artifacts[0]} -{a}": first.variant(CascadeOptions.without(*a.split("+")), f"-{a}") for a in args.ablations}
    methods.update(variants)
    for model in args.with_direct:
        methods[f"direct:{model}"] = load_method("direct", model=model, engine=args.engine, prefix_caching=True)
    rows = []
    for step in tqdm(steps, desc="agent steps", unit="conversation"):
        row = {"id": step.id, "source": step.source, "kind": step_kind(step), "gold": step.remaining}
        if args.agentdojo:
            row["gold_kinds"] = gold_kinds(step)
        for label, method in methods.items():
            if label in variants:  # the first cascade's library, already read
                method.set_library_state(first.library_state())
            library_seconds = fix_library(method, step.tools) if args.agentdojo else 0.0
            start = time.perf_counter()
            answer = method.answer(step.messages, step.tools)
            row[label] = {"right": step_right(step, answer.calls), "seconds": round(time.perf_counter() - start, 3),
                          "library_seconds": round(library_seconds, 3), "error": answer.error,
                          "decision": "call" if answer.calls else "answer",
                          "calls": [[c.name, c.arguments] for c in answer.calls],
                          "next_step": answer.details.get("next_step"),
                          **{k: answer.details[k] for k in ("p_answer", "answerability", "answerability_conversation", "refused_by")
                             if k in answer.details}}
        rows.append(row)
        summary = write(args, methods, rows)  # after every conversation: a stopped run keeps what it did
    plot(summary, Path(args.out).with_suffix(".png"))
    print(json.dumps({"kinds": dict(Counter(r["kind"] for r in rows)), "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
