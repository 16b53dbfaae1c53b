"""Final answers after tool results: does the text reply carry the results' key facts?

The conversations are fc-train's validation examples extended call -> result (`agent_steps.py`,
"answer" steps only: every call made and answered); a result's key facts are its outcome's values
(a number, a code, a date, list items). The reply is written as `hyfunc serve` writes it: the
model's chat template over the conversation, the results hint in the system prompt and the request
asked again after the results (`with_results_reminder`), greedy, and a reply that opens like a call
held back (`serving/replies.py`). A fact counts as told when it
appears in the reply, numbers also in another spelling (1234.0 as "1,234" or "1234").
"""
from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from hyfunc.cascade.agent_steps import ANSWER, AgentStep, agent_steps
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.eval.plots import bars_per_source
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.models.base import PrefixCache
from hyfunc.serving.replies import ANSWER_FROM_RESULTS, with_results_reminder, write_text

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[float]:
    found = set()
    for match in _NUMBER.findall(text):
        try:
            found.add(float(match.replace(",", "")))
        except ValueError:
            continue
    return found


def fact_told(fact: str, reply: str) -> bool:
    if fact.lower() in reply.lower():
        return True
    try:
        value = float(fact)
    except ValueError:
        return False
    return value in _numbers(reply)


def held_out_answer_steps(data: Sequence[str], per_source: int, seed: int = 0) -> list[AgentStep]:
    """"Answer" conversations built from the validation split of `data` (never trained on)."""
    _, validation = split_examples(load_examples(list(data)))
    return [step for step in agent_steps(validation, per_source, seed) if step.label == ANSWER]


def answer_facts(backend, steps: Sequence[AgentStep], max_tokens: int = 200, progress: bool = True) -> list[dict]:
    """One record per conversation: the reply, the facts told and missed, the reply's cost."""
    cache = PrefixCache(backend)
    records = []
    for step in tqdm(steps, desc="final answers", unit="conv", disable=not progress):
        messages = with_results_reminder([{"role": "system", "content": ANSWER_FROM_RESULTS}, *step.messages])
        reply = write_text(backend, messages, max_tokens, prefix_cache=cache, hold_calls=True)
        told = [fact for fact in step.facts if fact_told(fact, reply.text)]
        records.append({
            "id": step.id, "source": step.source, "facts": step.facts, "told": told,
            "all_told": len(told) == len(step.facts), "reply": reply.text, "call_text": reply.call_text,
            "seconds": reply.seconds, "output_tokens": reply.output_tokens,
        })
    return records


def summarize(records: Sequence[dict]) -> dict:
    def figures(rows: Sequence[dict]) -> dict:
        facts = sum(len(r["facts"]) for r in rows)
        return {
            "n": len(rows),
            "all_facts_told": sum(r["all_told"] for r in rows) / len(rows),
            "facts_told": sum(len(r["told"]) for r in rows) / max(facts, 1),
            "call_text_held_back": sum(bool(r["call_text"]) for r in rows),
            "median_seconds": statistics.median(r["seconds"] for r in rows),
        }

    sources = sorted({r["source"] for r in records})
    out = {source: figures([r for r in records if r["source"] == source]) for source in sources}
    out["all"] = figures(records)
    return out


def write_report(directory: Path, records: Sequence[dict], meta: dict, argv: Sequence[str]) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    figures = summarize(records)
    full = {"command": "hyfunc " + shlex.join(argv[1:]), "provenance": provenance(), **meta, "figures": figures}
    (directory / "final_answers.json").write_text(json.dumps(full, indent=2) + "\n")
    with open(directory / "replies.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    rows = [f"| {source} | {f['n']} | {f['all_facts_told']:.1%} | {f['facts_told']:.1%} | {f['call_text_held_back']} | "
            f"{f['median_seconds']:.1f} |" for source, f in figures.items()]
    lines = [
        "# Final answers after tool results: are the results' key facts in the reply?",
        "",
        f"Command: `{full['command']}`",
        "",
        f"{len(records)} conversations from fc-train's validation split (not trained on), every call made and "
        "answered with a synthesized result (`hyfunc/cascade/agent_steps.py`); the reply written as `hyfunc serve` "
        f"writes it, by {meta['model']} on {meta['engine']}, greedy, at most {meta['max_tokens']} tokens. "
        "Key facts: the results' outcome values.",
        "",
        "| source | n | all facts told | facts told | replies held back as calls | median s |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        provenance_markdown(full["provenance"]),
    ]
    (directory / "README.md").write_text("\n".join(lines) + "\n")
    bars_per_source(directory / "final_answers.png", {s: f["all_facts_told"] for s, f in figures.items() if s != "all"},
                    "replies with every key fact", "final answer after tool results, held-out conversations",
                    color="#47a")
    return figures
