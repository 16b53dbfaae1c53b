"""Agent conversations built from single-turn examples: the step after a tool result.

An agent sends a tool's result back and expects the next step: a text answer when the request is
done, or another call when part of it is still open. fc-train holds requests with their gold
calls but no results, so the conversations are extended call -> plausible result -> next step:

- every call made and answered (in one assistant turn, or one call per turn)   -> "answer"
- only the first k of n calls made and answered                                -> "call"
- two requests of one source joined into one ("... Also, ..."), their tools
  offered together: after the first request's calls -> "call", after both -> "answer"
- chained (optional): two requests joined where the second one's value is one the first call
  returns ("... Then book a table at the restaurant id it returns."): before any call, only the
  first request's calls are due ("call", an opening step: no result yet); after their results,
  whose one holds the value, the second call with that value ("call"); after both, "answer"
- joined openings (optional): two independent requests asked at once, before any call: every
  call of both is due at once. The chained opening's counterpart, with the same joiners ("Then",
  a new line): only a reference to a returned value defers the second request's calls
- follow-ups (validation): a request done and answered, then the user's next message: another
  request ("call"), one no offered tool fits, or small talk ("answer")

Results are synthesized from the call (its arguments and an outcome), as JSON or prose, so the
decision is learned from what was asked and what was done, not from any result's wording.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from hyfunc.cascade.data import Example
from hyfunc.formats.schema import Tool

ANSWER, CALL = "answer", "call"
JOINERS = (" Also, ", " After that, ", "\n", " And ")
CHAIN_JOINERS = (" Then ", " After that, ", " Once you have it, ", "\n")
# How the second request names the value the first call returns ({} = its parameter in words).
REFERENCES = ("the {} it returns", "the {} from that", "the resulting {}", "that {}", "the {} you get")
# Joiners of two independent requests asked at once: those of chained requests too, but the one
# that says the second waits for the first.
OPENING_JOINERS = JOINERS + (" Then ",)
# The kinds of conversation whose next step is a call, as the small model learns them.
STEP_KINDS = ("chained_opening", "joined_opening", "after_results")


@dataclass
class AgentStep:
    """A conversation that ends with tool results, and what the assistant should do next."""

    id: str
    source: str
    messages: list[dict]  # user / assistant (tool_calls) / tool chat messages
    tools: list[Tool]
    label: str  # ANSWER | CALL
    remaining: list[dict] = field(default_factory=list)  # the calls still to make (CALL)
    facts: list[str] = field(default_factory=list)  # the results' outcomes: what an answer must tell
    origin: tuple[str, ...] = ()  # the ids of the examples it was built from
    form: str = "single"  # single | joined | chained: how its request was made

    @property
    def after_results(self) -> bool:
        """False for an opening step (the request alone, no call made yet)."""
        return bool(self.messages) and self.messages[-1].get("role") == "tool"

    @property
    def kind(self) -> str:
        """One of STEP_KINDS for a call step built by this module (a single request's opening is
        the single-turn data's, never built here)."""
        return "after_results" if self.after_results else f"{self.form}_opening"


def _words(name: str) -> str:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return re.sub(r"[_\-.]+", " ", spaced).strip().lower()


def _outcome(call: dict, rng: random.Random) -> object:
    kind = rng.randrange(6)
    if kind == 0:
        return round(rng.uniform(1, 500), rng.choice((0, 1, 2)))
    if kind == 1:
        return rng.choice(("completed", "success", "confirmed", "found", "available", "updated"))
    if kind == 2:
        return f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randint(1000, 99999)}"
    if kind == 3:
        return [f"{_words(call['name']).split(' ')[-1]} {i + 1}" for i in range(rng.randint(1, 3))]
    if kind == 4:
        return f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(2019, 2026)} {rng.randint(0, 23):02d}:{rng.choice(('00', '15', '30', '45'))}"
    return {"count": rng.randint(0, 40), "items": rng.randint(0, 5)}


def _facts(outcome: object) -> list[str]:
    values = list(outcome.values()) if isinstance(outcome, dict) else outcome if isinstance(outcome, list) else [outcome]
    return [str(v) for v in values]


def tool_result(call: dict, rng: random.Random, returned: dict | None = None) -> tuple[str, list[str]]:
    """A plausible result of `call` ({"name", "arguments"}), as JSON or as a sentence, and its
    key facts (the outcome's values). `returned`: key -> value the result must also hold (a
    chained step's value)."""
    arguments = call.get("arguments") or {}
    outcome = _outcome(call, rng)
    returned = returned or {}
    style = rng.randrange(3)
    if style == 0:
        text = json.dumps({"status": "success", **arguments, "result": outcome, **returned}, ensure_ascii=False)
        return text, _facts(outcome)
    if style == 1:
        return json.dumps({"result": outcome, **returned}, ensure_ascii=False), _facts(outcome)
    shown = ", ".join(f"{k} {v}" for k, v in list(arguments.items())[:3])
    outcome_text = outcome if isinstance(outcome, str) else json.dumps(outcome, ensure_ascii=False)
    extra = "".join(f"; {_words(k)}: {v}" for k, v in returned.items())
    return f"{_words(call['name']).capitalize()}{' for ' + shown if shown else ''}: {outcome_text}{extra}.", _facts(outcome)


def _call_turns(calls: Sequence[dict], prefix: str, rng: random.Random, together: bool,
                returned: dict | None = None) -> tuple[list[dict], list[str]]:
    """The assistant's calls and their results (all calls in one turn then their results, or one
    call and its result at a time), and the results' key facts. `returned` goes into the last
    call's result."""
    ids = [f"call_{prefix}_{i}" for i in range(len(calls))]
    wire = [{"id": i, "type": "function", "function": {"name": c["name"], "arguments": c.get("arguments") or {}}}
            for i, c in zip(ids, calls)]
    made = [tool_result(c, rng, returned if i == len(calls) - 1 else None) for i, c in enumerate(calls)]
    results = [{"role": "tool", "tool_call_id": i, "content": text} for i, (text, _) in zip(ids, made)]
    facts = [fact for _, found in made for fact in found]
    if together:
        return [{"role": "assistant", "content": "", "tool_calls": wire}, *results], facts
    return [m for w, r in zip(wire, results) for m in ({"role": "assistant", "content": "", "tool_calls": [w]}, r)], facts


def _calls(example: Example) -> list[dict]:
    return [{"name": c.name, "arguments": dict(c.arguments)} for c in example.answers]


def _steps_of(example: Example, rng: random.Random) -> Iterable[AgentStep]:
    calls = _calls(example)
    user = {"role": "user", "content": example.query}
    together = rng.random() < 0.5
    turns, facts = _call_turns(calls, "a", rng, together)
    yield AgentStep(example.id, example.source, [user, *turns], list(example.tools), ANSWER, facts=facts,
                    origin=(example.id,))
    if len(calls) > 1:
        k = rng.randint(1, len(calls) - 1)
        done, facts = _call_turns(calls[:k], "p", rng, together)
        yield AgentStep(f"{example.id}:first{k}", example.source, [user, *done], list(example.tools), CALL, calls[k:],
                        facts, origin=(example.id,))


def _joined(first: Example, second: Example, rng: random.Random) -> Iterable[AgentStep]:
    """Two requests asked at once: after the first one's calls the second is still open."""
    tools = list(first.tools) + list(second.tools)
    query = first.query.rstrip() + rng.choice(JOINERS) + second.query.lstrip()
    user = {"role": "user", "content": query}
    together = rng.random() < 0.5
    head, head_facts = _call_turns(_calls(first), "j1", rng, together)
    rid = f"{first.id}+{second.id}"
    origin = (first.id, second.id)
    yield AgentStep(f"{rid}:first", first.source, [user, *head], tools, CALL, _calls(second), head_facts, origin, "joined")
    tail, tail_facts = _call_turns(_calls(second), "j2", rng, together)
    yield AgentStep(rid, first.source, [user, *head, *tail], tools, ANSWER, facts=head_facts + tail_facts, origin=origin,
                    form="joined")


def _returned_value(example: Example) -> tuple[str, str] | None:
    """(parameter, value) of a single-call example whose request states a string value verbatim,
    once (at least 3 characters): the value a chained request can leave to an earlier call instead."""
    if len(example.answers) != 1:
        return None
    for key, value in example.answers[0].arguments.items():
        if isinstance(value, str) and len(value.strip()) >= 3 and len(_mentions(value, example.query)) == 1:
            return key, value
    return None


def _mentions(value: str, text: str) -> list[re.Match]:
    """Where `value` stands in `text` as a whole (not inside a longer word), any case."""
    return list(re.finditer(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.IGNORECASE))


def _join(first: str, joiner: str, second: str) -> str:
    if not joiner.endswith("\n") and second[:2].istitle():  # "Then book ...", not "Then Book ..." (nor "Then iPhone")
        second = second[0].lower() + second[1:]
    return first.rstrip() + joiner + second


def _chained(first: Example, second: Example, key: str, value: str, rng: random.Random) -> list[AgentStep]:
    """The second request's `value` replaced by a reference to what the first call returns."""
    [at] = _mentions(value, second.query)
    reference = rng.choice(REFERENCES).format(_words(key))
    rest = second.query[:at.start()] + reference + second.query[at.end():]
    user = {"role": "user", "content": _join(first.query, rng.choice(CHAIN_JOINERS), rest)}
    tools = list(first.tools) + list(second.tools)
    together = rng.random() < 0.5
    head, head_facts = _call_turns(_calls(first), "c1", rng, together, returned={key: value})
    tail, tail_facts = _call_turns(_calls(second), "c2", rng, together)
    rid, origin = f"{first.id}>{second.id}", (first.id, second.id)
    return [
        AgentStep(f"{rid}:opening", first.source, [user], tools, CALL, _calls(first), origin=origin, form="chained"),
        AgentStep(f"{rid}:first", first.source, [user, *head], tools, CALL, _calls(second), head_facts, origin, "chained"),
        AgentStep(rid, first.source, [user, *head, *tail], tools, ANSWER, facts=head_facts + tail_facts, origin=origin,
                  form="chained"),
    ]


def chained_steps(examples: Sequence[Example], per_source: int, seed: int = 0) -> list[AgentStep]:
    """Up to `per_source` chained requests per source, each as its three steps (opening, after
    the first call's results, after both)."""
    rng = random.Random(f"chained:{seed}")
    out: list[AgentStep] = []
    for source, pool in sorted(_by_source(examples).items()):
        seconds = [(ex, found) for ex in pool if (found := _returned_value(ex))]
        rng.shuffle(pool)
        rng.shuffle(seconds)
        made = 0
        for first, (second, (key, value)) in zip(pool, seconds):
            if made >= per_source:
                break
            if first.id == second.id or _mentions(value, first.query) or _share_tools(first, second):
                continue
            out += _chained(first, second, key, value, rng)
            made += 1
    return out


def joined_openings(examples: Sequence[Example], per_source: int, seed: int = 0) -> list[AgentStep]:
    """Up to `per_source` pairs of independent requests per source asked at once, as their opening
    step: nothing called yet, every call of both due."""
    rng = random.Random(f"joined-openings:{seed}")
    out: list[AgentStep] = []
    for source, pool in sorted(_by_source(examples).items()):
        rng.shuffle(pool)
        made = 0
        for first, second in zip(pool[::2], pool[1::2]):
            if made >= per_source:
                break
            if _share_tools(first, second):
                continue
            user = {"role": "user", "content": _join(first.query, rng.choice(OPENING_JOINERS), second.query)}
            out.append(AgentStep(f"{first.id}&{second.id}:opening", source, [user], list(first.tools) + list(second.tools),
                                 CALL, _calls(first) + _calls(second), origin=(first.id, second.id), form="joined"))
            made += 1
    return out


def follow_ups(examples: Sequence[Example], per_source: int, small_talk: Sequence[str], seed: int = 0) -> list[AgentStep]:
    """A finished request (its calls, their results, a text reply), then the user's next message,
    up to `per_source` of each kind per source: another request of the source, its tools offered
    beside the first one's ("call": its calls); a request of another source whose tools are not
    offered ("answer": no tool fits); a line of `small_talk` ("answer")."""
    rng = random.Random(f"follow-ups:{seed}")
    by_source = _by_source(examples)
    out: list[AgentStep] = []
    for source, pool in sorted(by_source.items()):
        rng.shuffle(pool)
        others = [ex for s, exs in sorted(by_source.items()) if s != source for ex in exs]
        pairs = [(a, b) for a, b in zip(pool[::2], pool[1::2]) if not _share_tools(a, b)][:per_source]
        for i, (first, second) in enumerate(pairs):
            done, facts = _call_turns(_calls(first), "f", rng, rng.random() < 0.5)
            history = [{"role": "user", "content": first.query}, *done,
                       {"role": "assistant", "content": "Here is what I found: " + "; ".join(facts) + "."}]
            tools = list(first.tools) + list(second.tools)
            rng.shuffle(tools)
            unrelated = rng.choice([ex for ex in others if not _share_tools(first, ex)])
            for form, request, offered, label, remaining in (
                ("follow_up", second.query, tools, CALL, _calls(second)),
                ("follow_up_unrelated", unrelated.query, list(first.tools), ANSWER, []),
                ("follow_up_small_talk", rng.choice(small_talk), list(first.tools), ANSWER, []),
            ):
                out.append(AgentStep(f"{first.id}:{form}:{i}", source, [*history, {"role": "user", "content": request}],
                                     offered, label, remaining, origin=(first.id,), form=form))
    return out


def _share_tools(first: Example, second: Example) -> bool:
    """Two requests joined must not offer one tool twice: each call's tool stays unambiguous."""
    return bool({t.name for t in first.tools} & {t.name for t in second.tools})


def _by_source(examples: Sequence[Example]) -> dict[str, list[Example]]:
    by_source: dict[str, list[Example]] = {}
    for example in examples:
        if example.answers:
            by_source.setdefault(example.source, []).append(example)
    return by_source


def agent_steps(examples: Sequence[Example], per_source: int, seed: int = 0) -> list[AgentStep]:
    """Up to `per_source` steps of each label from each source's examples with calls (refusals
    have no result to follow). Joined requests fill the "call" side where a source has few
    multi-call examples; their tools must not overlap, so each call's tool stays unambiguous."""
    rng = random.Random(seed)
    by_source = _by_source(examples)
    out: list[AgentStep] = []
    for source in sorted(by_source):
        pool = list(by_source[source])
        rng.shuffle(pool)
        steps: dict[str, list[AgentStep]] = {ANSWER: [], CALL: []}
        for example in pool:
            for step in _steps_of(example, rng):
                steps[step.label].append(step)
        for first, second in zip(pool[::2], pool[1::2]):
            if len(steps[CALL]) >= per_source and len(steps[ANSWER]) >= per_source:
                break
            if _share_tools(first, second):
                continue
            for step in _joined(first, second, rng):
                steps[step.label].append(step)
        # Answers from single requests and from joined ones alike, so that neither form alone
        # tells the label.
        for label in (ANSWER, CALL):
            rng.shuffle(steps[label])
            out += steps[label][:per_source]
    return out
