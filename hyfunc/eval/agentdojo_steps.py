"""AgentDojo's agent conversations: the step after real tool results, on tools no one here wrote.

`hyfunc/data/ood/agentdojo-steps.json` (made by `scripts/agentdojo_to_jsonl.py --steps`; see
hyfunc/data/ood/README.md) holds each suite's tools once and the conversations: a task's
ground-truth calls made one per turn with the results AgentDojo's environment returned, then
- "answer": every call made -> right when no call is made (a text answer follows);
- "calls_left": some calls made -> right when calls are made and each is one of the ground
  truth's calls still to make (the next one usually; a later one whose values are already known
  counts too: which comes first is not always fixed);
- "follow_up": a finished task and a reply, then another task of the suite -> right when the
  calls made are its first ground-truth call (its prompt states every value);
- "follow_up_small_talk": the same history, then a held-out small-talk line -> right when no call
  is made.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from hyfunc.cascade.agent_steps import ANSWER, AgentStep
from hyfunc.data import OOD_DATA
from hyfunc.formats.calls import Call, same_calls
from hyfunc.formats.schema import parse_tools

AGENTDOJO_STEPS = OOD_DATA / "agentdojo-steps.json"
KINDS = ("answer", "calls_left", "follow_up", "follow_up_small_talk")


def load_agentdojo_steps(path: str | Path = AGENTDOJO_STEPS) -> list[AgentStep]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    tools = {suite: parse_tools(docs) for suite, docs in data["suites"].items()}
    return [
        AgentStep(s["id"], s["suite"], s["messages"], list(tools[s["suite"]]), s["label"], s["remaining"],
                  form=s["kind"] if s["kind"].startswith("follow_up") else "single")
        for s in data["steps"]
    ]


def sample_after_results(per_suite: int, seed: int = 0, path: str | Path = AGENTDOJO_STEPS) -> list[AgentStep]:
    """A seeded sample of up to `per_suite` conversations per suite that end with tool results,
    in the file's order."""
    steps = [s for s in load_agentdojo_steps(path) if s.after_results]
    out: list[AgentStep] = []
    for suite in sorted({s.source for s in steps}):
        members = [s for s in steps if s.source == suite]
        kept = {s.id for s in random.Random(seed).sample(members, min(per_suite, len(members)))}
        out += [s for s in members if s.id in kept]
    return out


def step_kind(step: AgentStep) -> str:
    if step.form.startswith("follow_up"):
        return step.form
    return "answer" if step.label == ANSWER else "calls_left"


def right(step: AgentStep, calls: list[Call]) -> bool:
    """Whether `calls` is a right next step for `step` (the module's docstring says when)."""
    if step.label == ANSWER:
        return not calls
    gold = [Call(c["name"], dict(c.get("arguments") or {})) for c in step.remaining]
    if step.form == "follow_up":
        return same_calls(calls, gold[:1])
    return bool(calls) and all(any(same_calls([call], [g]) for g in gold) for call in calls)
