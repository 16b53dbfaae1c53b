"""Does the next-step head stop counting results when it learns long tasks too?

    python scripts/next_step_long_tasks.py --per-source 10 --chained-per-source 3 --long-per-source 6 \
        --out reports/next-step/long-tasks

On AgentDojo the shipped head answers after two results and calls before (`reports/next-step/signals/`):
in its training conversations (single and joined requests of fc-train) the number of results made
mostly tells whether the task is done. Long tasks (`long_steps` below: three or four requests
asked at once, one call per turn, "call" after 2 to n-1 results, "answer" after all n) break that.

Two heads, trained as `hyfunc prepare` trains one (logistic regression on the soft token, threshold
with the best mean leave-one-source-out accuracy over fc-train's sources, then fitted on them all):
- "base": fc-train's single, joined and chained conversations;
- "base + long": the same and the long tasks (`long_steps` below).
Scored on (1) every fc-train conversation, leave-one-source-out (each source by heads trained on
the others: the base head never sees a long task, so its score on them is held out too) and (2)
AgentDojo's after-results sample of `reports/next-step/signals/` (never trained on), beside the
shipped head. The soft tokens come from one pass of the cascade's large model each (as served),
cached in $HYFUNC_HOME/next-step-cache as `hyfunc prepare` caches them: a rerun reuses them, and
the cache does not know which code wrote them (delete it to pass them all again).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch

from hyfunc.cascade.agent_steps import (
    ANSWER,
    CALL,
    JOINERS,
    AgentStep,
    _by_source,
    _call_turns,
    _calls,
    _join,
    _share_tools,
    agent_steps,
    chained_steps,
)
from hyfunc.cascade.data import Example, load_examples
from hyfunc.cascade.next_step import NEXT_STEP_DIR, NextStepConfig, NextStepHead, best_threshold, fit_head
from hyfunc.cascade.next_step_training import cache_file, encode_steps
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.config import hyfunc_home
from hyfunc.data import FC_TRAIN
from hyfunc.eval.agentdojo_steps import sample_after_results
from hyfunc.eval.plots import grouped_bars
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.methods.cascade import DEFAULT_ARTIFACT
from hyfunc.models.engines import load_backend


def long_steps(examples: Sequence[Example], per_source: int, seed: int = 0) -> list[AgentStep]:
    """Up to `per_source` long tasks per source: three or four requests asked at once (no tool
    shared), their calls made one per turn (3 or more results), as two steps: after k of the n
    calls (2 <= k < n) -> "call"; after all -> "answer". Beside single and joined requests (one or
    two results), the number of results made so far no longer tells whether the task is done."""
    rng = random.Random(f"long:{seed}")
    out: list[AgentStep] = []
    for source, pool in sorted(_by_source(examples).items()):
        rng.shuffle(pool)
        made, at = 0, 0
        while made < per_source and at + 4 <= len(pool):
            parts = pool[at:at + rng.choice((3, 4))]
            at += len(parts)
            if any(_share_tools(a, b) for i, a in enumerate(parts) for b in parts[i + 1:]):
                continue
            query = parts[0].query
            for part in parts[1:]:
                query = _join(query, rng.choice(JOINERS), part.query)
            user = {"role": "user", "content": query}
            tools = [t for part in parts for t in part.tools]
            calls = [c for part in parts for c in _calls(part)]
            k = rng.randint(2, len(calls) - 1)
            drawn = rng.getstate()  # the first k results drawn alike in both steps
            done, done_facts = _call_turns(calls[:k], "l", rng, together=False)
            rng.setstate(drawn)
            turns, facts = _call_turns(calls, "l", rng, together=False)
            rid, origin = "+".join(p.id for p in parts), tuple(p.id for p in parts)
            out.append(AgentStep(f"{rid}:first{k}", source, [user, *done], tools, CALL, calls[k:], done_facts, origin,
                                 "long"))
            out.append(AgentStep(rid, source, [user, *turns], tools, ANSWER, facts=facts, origin=origin, form="long"))
            made += 1
    return out


def results_made(step: AgentStep) -> int:
    return sum(m.get("role") == "tool" for m in step.messages)


def loso_scores(soft: torch.Tensor, answers: torch.Tensor, sources: list[str], trained: torch.Tensor,
                config: NextStepConfig) -> torch.Tensor:
    """P(answer) of every conversation from a head fitted on the `trained` conversations of the
    other sources."""
    out = torch.empty(len(sources))
    for source in sorted(set(sources)):
        held = torch.tensor([s == source for s in sources])
        head = fit_head(soft[trained & ~held], answers[trained & ~held], config)
        out[held] = head.p_answer(soft[held])
    return out


def cells(said: torch.Tensor, steps: list[AgentStep], key) -> dict:
    """Right decisions per group (`key(step)`) and overall."""
    out: dict = {}
    for step, answer in zip(steps, said.tolist()):
        for group in ("all", str(key(step))):
            cell = out.setdefault(group, {"n": 0, "right": 0})
            cell["n"] += 1
            cell["right"] += answer == (step.label == ANSWER)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "all", int(kv[0]) if kv[0].isdigit() else 0, kv[0])))


def agentdojo_figures(p_answer: torch.Tensor, threshold: float, dojo: list[AgentStep]) -> dict:
    """A head's decisions on AgentDojo's conversations (P(answer) at or above `threshold`: answer)."""
    said = p_answer >= threshold
    return {
        "agentdojo, by suite": cells(said, dojo, lambda s: s.source),
        "agentdojo, by label": cells(said, dojo, lambda s: s.label),
        "agentdojo, by results made": cells(said, dojo, results_made),
        "agentdojo answers said": int(said.sum()),
        "agentdojo auc": auc(p_answer, torch.tensor([s.label == ANSWER for s in dojo])),
    }

def run(args: argparse.Namespace) -> dict:
    examples = load_examples([str(FC_TRAIN)])
    fc = agent_steps(examples, args.per_source, args.seed)
    fc += [s for s in chained_steps(examples, args.chained_per_source, args.seed) if s.after_results]
    fc += long_steps(examples, args.long_per_source, args.seed)
    dojo = sample_after_results(args.agentdojo_per_suite, args.seed)
    shipped = NextStepHead.load(args.artifact / NEXT_STEP_DIR)
    large = load_backend(shipped.config.large_model, args.engine, role="large")
    cache = cache_file(hyfunc_home() / "next-step-cache", large)
    encoder = SoftTokenEncoder(large)
    soft = encode_steps(encoder, fc, cache)
    dojo_soft = encode_steps(encoder, dojo, cache)

    answers = torch.tensor([s.label == ANSWER for s in fc])
    sources = [s.source for s in fc]
    is_long = torch.tensor([s.form == "long" for s in fc])
    record: dict = {
        "command": "python " + " ".join(sys.argv), "provenance": provenance(), "engine": large.description,
        "conversations": {"fc-train": dict(Counter(f"{s.form} {s.label}" for s in fc)),
                          "agentdojo": dict(Counter(f"{s.source} {s.label}" for s in dojo))},
        "heads": {},
    }
    variants = {"base": ~is_long, "base + long": torch.ones(len(fc), dtype=torch.bool)}
    for name, trained in variants.items():
        config = NextStepConfig(large_model=large.name)
        scores = loso_scores(soft, answers, sources, trained, config)
        threshold = best_threshold(scores[trained], answers[trained], [s for s, t in zip(sources, trained) if t])
        head = fit_head(soft[trained], answers[trained], config)
        record["heads"][name] = {
            "trained_on": int(trained.sum()), "threshold": threshold,
            "fc-train held out, by form": cells(scores >= threshold, fc, lambda s: s.form),
            "fc-train held out, by source": cells(scores >= threshold, fc, lambda s: s.source),
            **agentdojo_figures(head.p_answer(dojo_soft), threshold, dojo),
        }
    record["heads"]["shipped"] = {
        "trained_on": shipped.config.training.get("conversations"), "threshold": shipped.config.threshold,
        **agentdojo_figures(shipped.p_answer(dojo_soft), shipped.config.threshold, dojo),
    }
    return record


def auc(scores: torch.Tensor, answers: torch.Tensor) -> float:
    """P(a random answer conversation scores above a random call one)."""
    a, c = scores[answers], scores[~answers]
    return round(float(((a[:, None] > c[None, :]).float() + 0.5 * (a[:, None] == c[None, :]).float()).mean()), 4)


def write(out: Path, record: dict) -> None:
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    heads = record["heads"]

    def cell(name: str, table: str, key: str) -> str:
        c = heads[name].get(table, {}).get(key)
        return "–" if c is None else f"{c['right']} / {c['n']} ({c['right'] / c['n']:.1%})"

    rows = [(table, key) for table in ("agentdojo, by suite", "agentdojo, by label", "agentdojo, by results made")
            for key in heads["base"][table]]
    rows += [(table, key) for table in ("fc-train held out, by form", "fc-train held out, by source")
             for key in heads["base"][table]]
    lines = [
        "# The next-step head with and without long tasks", "",
        f"Command: `{record['command']}`", "", f"Engine: {record['engine']}", "",
        "| conversations | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads),
        "| trained on / threshold | " + " | ".join(f"{h['trained_on']} / {h['threshold']}" for h in heads.values()) + " |",
        "| AgentDojo AUC | " + " | ".join(str(h["agentdojo auc"]) for h in heads.values()) + " |",
        *(f"| {table.split(',')[0]} {table.split(', ')[1].replace('by ', '')} {key} | "
          + " | ".join(cell(n, table, key) for n in heads) + " |" for table, key in rows),
        "", provenance_markdown(record["provenance"]),
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    series = {name: {suite: c["right"] / c["n"] for suite, c in head["agentdojo, by suite"].items()} for name, head in heads.items()}
    grouped_bars(out / "results.png", series, "right: answer or call", "AgentDojo after tool results, by head (dashed: 95 %)",
                 target=0.95)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument("--engine", default="llamacpp")
    parser.add_argument("--per-source", type=int, default=10, help="fc-train conversations of each label per source")
    parser.add_argument("--chained-per-source", type=int, default=3, help="fc-train chained requests per source")
    parser.add_argument("--long-per-source", type=int, default=6, help="fc-train long tasks per source (two steps each)")
    parser.add_argument("--agentdojo-per-suite", type=int, default=45, help="AgentDojo conversations per suite (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    record = run(args)
    write(args.out, record)
    print(json.dumps({name: head["agentdojo, by suite"]["all"] for name, head in record["heads"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
