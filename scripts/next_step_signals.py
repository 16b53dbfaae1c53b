"""Answer or call after tool results: the next-step head against the large model's own first token.

    python scripts/next_step_signals.py --per-source 4 --chained-per-source 2 --agentdojo-per-suite 45 \
        --out reports/next-step/signals

One pass of the cascade's large model over each conversation, as served (instruction and tools in the
system prompt, the conversation in its chat template; a suite's or example's tools read once as a
library), gives two signals of the same state:
- p_answer: the shipped next-step head on the soft token (`hyfunc/cascade/next_step.py`; trained on
  fc-train's agent conversations);
- p_call: the model's own probability that its reply starts with a call (`CALL_STARTS` below),
  which nothing here was trained for.
Conversations: fc-train's agent conversations (`agent_steps.py`, seed 0: all of fc-train's sources;
the head trained on conversations built from the same examples) and AgentDojo's after-results ones
(`hyfunc/data/ood/agentdojo-steps.json`, a seeded sample per suite: no head or threshold saw them).
Thresholds for p_call are chosen on fc-train's conversations only (best mean accuracy over its
sources), then every rule is scored on AgentDojo. Rows go to `rows.jsonl` as they come (a rerun
goes on from them); `--replot` only recomputes the figures from the rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from hyfunc.cascade.agent_steps import ANSWER, AgentStep, agent_steps, chained_steps
from hyfunc.cascade.data import load_examples
from hyfunc.cascade.next_step import NEXT_STEP_DIR, NextStepHead
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.data import FC_TRAIN
from hyfunc.eval.agentdojo_steps import sample_after_results, step_kind
from hyfunc.eval.plots import grouped_bars
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.methods.cascade import DEFAULT_ARTIFACT
from hyfunc.models.engines import load_backend

TOP = 12  # the likeliest first tokens kept per row, to read what the model would write
# The first tokens with which the large model starts a call under the cascade's instruction,
# which asks for calls without fixing their form: a JSON object or list, a fenced block, the chat
# template's tool-call tag.
CALL_STARTS = ('{"', "{", "[", "```", "``", "<tool_call>")


def call_start_ids(tokenizer) -> list[int]:
    """The ids of the CALL_STARTS that are one token of `tokenizer`'s vocabulary."""
    ids = (tokenizer.encode(start, add_special_tokens=False) for start in CALL_STARTS)
    return sorted({found[0] for found in ids if len(found) == 1})


def p_call(logits: torch.Tensor, ids: list[int]) -> float:
    """The model's own probability that its reply starts with a call (next-token `logits`)."""
    return float(torch.softmax(logits.float(), -1)[ids].sum())


def conversations(args: argparse.Namespace) -> list[tuple[str, AgentStep]]:
    """(set, step) pairs: fc-train's after-results conversations, then AgentDojo's sample."""
    examples = load_examples([str(FC_TRAIN)])
    fc = agent_steps(examples, args.per_source, args.seed)
    fc += [s for s in chained_steps(examples, args.chained_per_source, args.seed) if s.after_results]
    sample = sample_after_results(args.agentdojo_per_suite, args.seed)
    return [("fc-train", s) for s in fc] + [("agentdojo", s) for s in sample]


def run_passes(args: argparse.Namespace, rows_path: Path) -> None:
    done = {json.loads(line)["id"] for line in rows_path.open()} if rows_path.is_file() else set()
    todo = [(group, s) for group, s in conversations(args) if s.id not in done]
    if not todo:
        return
    head = NextStepHead.load(args.artifact / NEXT_STEP_DIR)
    large = load_backend(head.config.large_model, args.engine, role="large")
    encoder, ids = SoftTokenEncoder(large), call_start_ids(large.tokenizer)
    by_tools: dict[str, list[tuple[str, AgentStep]]] = {}
    for group, step in todo:
        by_tools.setdefault(json.dumps([t.to_json_schema() for t in step.tools], sort_keys=True), []).append((group, step))
    with rows_path.open("a") as out:
        for members in by_tools.values():
            library = encoder.build_library(members[0][1].tools) if len(members) > 1 else None
            for group, step in members:
                start = time.perf_counter()
                encoding = encoder.encode(step.messages, library or step.tools)
                logits = encoding.state.logits.float()
                top = torch.topk(torch.log_softmax(logits, -1), TOP)
                row = {
                    "id": step.id, "set": group, "source": step.source, "label": step.label,
                    "kind": step_kind(step) if group == "agentdojo" else step.form,
                    "calls_made": sum(m.get("role") == "tool" for m in step.messages),
                    "p_answer": round(float(head.p_answer(encoding.soft_token)), 5),
                    "p_call": round(p_call(logits, ids), 5),
                    "top": [[large.tokenizer.decode([int(i)]), round(float(v), 3)] for v, i in zip(top.values, top.indices)],
                    "seconds": round(time.perf_counter() - start, 2),
                }
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.flush()
                print(f"{row['id']}: {row['label']} p_answer {row['p_answer']} p_call {row['p_call']}", flush=True)


def rules(head_threshold: float, call_threshold: float) -> dict:
    """Each rule: row -> says "answer"?"""
    return {
        "head (shipped)": lambda r: r["p_answer"] >= head_threshold,
        "first token": lambda r: r["p_call"] < call_threshold,
        "head and first token": lambda r: r["p_answer"] >= head_threshold and r["p_call"] < call_threshold,
    }


def right(rule, rows: list[dict]) -> int:
    """How many of `rows` the rule decides as labelled."""
    return sum(rule(r) == (r["label"] == ANSWER) for r in rows)


def mean_source_accuracy(rule, rows: list[dict]) -> float:
    sources = sorted({r["source"] for r in rows})
    return sum(right(rule, part) / len(part) for s in sources if (part := [r for r in rows if r["source"] == s])) / len(sources)


def choose_call_threshold(rows: list[dict], head_threshold: float, rule_name: str) -> float:
    """The p_call threshold with the best mean accuracy over fc-train's sources (ties: nearest 0.5)."""
    fc = [r for r in rows if r["set"] == "fc-train"]
    grid = [i / 100 for i in range(1, 100)]
    return max(grid, key=lambda t: (mean_source_accuracy(rules(head_threshold, t)[rule_name], fc), -abs(t - 0.5)))


def figures(rows: list[dict], head_threshold: float) -> dict:
    thresholds = {name: choose_call_threshold(rows, head_threshold, name) for name in ("first token", "head and first token")}
    out = {"head_threshold": head_threshold, "call_thresholds": thresholds, "rules": {}}
    for name in ("head (shipped)", "first token", "head and first token"):
        rule = rules(head_threshold, thresholds.get(name, 0.5))[name]
        cells = {}
        for group in ("fc-train", "agentdojo"):
            mine = [r for r in rows if r["set"] == group]
            splits = {"all": mine, **{f"source {s}": [r for r in mine if r["source"] == s] for s in sorted({r['source'] for r in mine})},
                      **{f"kind {k}": [r for r in mine if r["kind"] == k] for k in sorted({r['kind'] for r in mine})}}
            cells[group] = {key: {"n": len(part), "right": right(rule, part)}
                            for key, part in splits.items() if part}
        out["rules"][name] = cells
    return out


def auc(rows: list[dict], score) -> float:
    """P(a random answer row scores above a random call row) under `score` (higher: answer)."""
    answers = [score(r) for r in rows if r["label"] == ANSWER]
    calls = [score(r) for r in rows if r["label"] != ANSWER]
    pairs = sum((a > c) + 0.5 * (a == c) for a in answers for c in calls)
    return round(pairs / (len(answers) * len(calls)), 4)


def write(args: argparse.Namespace, rows: list[dict], head_threshold: float) -> dict:
    record = {"command": "python " + " ".join(sys.argv), "provenance": provenance(), **figures(rows, head_threshold)}
    record["auc"] = {group: {"p_answer": auc([r for r in rows if r["set"] == group], lambda r: r["p_answer"]),
                             "1 - p_call": auc([r for r in rows if r["set"] == group], lambda r: -r["p_call"])}
                     for group in ("fc-train", "agentdojo")}
    (args.out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    names = list(record["rules"])
    keys = [("agentdojo", k) for k in record["rules"][names[0]]["agentdojo"]] + [("fc-train", "all")]

    def cell(name: str, group: str, key: str) -> str:
        c = record["rules"][name][group].get(key)
        return "–" if c is None else f"{c['right']} / {c['n']} ({c['right'] / c['n']:.1%})"

    thresholds = record["call_thresholds"]
    lines = [
        "# Answer or call after tool results: the head against the large model's own first token", "",
        f"Command: `{record['command']}`", "",
        f"Head threshold {head_threshold} (shipped); p_call thresholds chosen on fc-train: first token "
        f"{thresholds['first token']}, with the head {thresholds['head and first token']}. AUC (answer above call): "
        + "; ".join(f"{g}: head {a['p_answer']}, first token {a['1 - p_call']}" for g, a in record["auc"].items()), "",
        "| conversations | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
        *(f"| {group} {key} | " + " | ".join(cell(n, group, key) for n in names) + " |" for group, key in keys),
        "", provenance_markdown(record["provenance"]),
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    plot(args.out / "results.png", record)
    return record


def plot(path: Path, record: dict) -> None:
    series = {name: {key.replace("source ", ""): c["right"] / c["n"] for key, c in cells["agentdojo"].items()
                     if key.startswith("source") or key == "all"} for name, cells in record["rules"].items()}
    grouped_bars(path, series, "right: answer or call",
                 "AgentDojo after tool results (thresholds from fc-train; dashed: 95 %)", target=0.95)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument("--engine", default="llamacpp")
    parser.add_argument("--per-source", type=int, default=4, help="fc-train conversations of each label per source")
    parser.add_argument("--chained-per-source", type=int, default=2, help="fc-train chained requests per source")
    parser.add_argument("--agentdojo-per-suite", type=int, default=45, help="AgentDojo conversations per suite (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", action="store_true", help="only the figures, from the rows already written")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "rows.jsonl"
    if not args.replot:
        run_passes(args, rows_path)
    wanted = {s.id for _, s in conversations(args)}
    rows = [r for line in rows_path.open() if (r := json.loads(line))["id"] in wanted]
    record = write(args, rows, NextStepHead.load(args.artifact / NEXT_STEP_DIR).config.threshold)
    print(json.dumps({name: cells["agentdojo"]["all"] for name, cells in record["rules"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
