"""Schema augmentation: a training request again under another spelling of its tools' schemas, so the
cascade learns to read a schema instead of remembering its sources' house styles (users bring their
own tools). Each variant changes one thing and rewrites the answer to match:

- renamed: parameter names in the other case style (snake_case <-> camelCase);
- reordered: the parameters in another order;
- short / long descriptions: every parameter's description cut to its first sentence, or its type and
  whether it is required spelled out after it;
- enum in words: an enum's members only in its description ("One of: 'a', 'b'."), no `enum` keyword;
- no defaults: optional parameters without their `default`;
- nested: a called tool's parameters moved into one object parameter, the call's arguments with them;
- batched: a tool called several times becomes one taking an array of objects (its parameters), called
  once with the list (BFCL's and users' "array of objects" parameters).

Ids name the example and the variant, so cached embeddings stay valid across runs.
"""
from __future__ import annotations

import copy
import random
import re
from dataclasses import replace
from typing import Callable

from hyfunc.cascade.data import Example
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import NO_DEFAULT, Param, Tool

NESTED_NAME = "options"
BATCH_NAME = "requests"


def _other_case(name: str) -> str:
    if "_" in name:
        head, *rest = [p for p in name.split("_") if p]
        return head + "".join(p[:1].upper() + p[1:] for p in rest) if rest else name
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _map_tools(example: Example, change: Callable[[Tool], Tool], only_called: bool = False) -> list[Tool]:
    called = {c.name for c in example.answers}
    return [change(copy.deepcopy(t)) if not only_called or t.name in called else t for t in example.tools]


def renamed(example: Example, rng: random.Random) -> Example | None:
    def rename(tool: Tool) -> Tool:
        names = {n: _other_case(n) for n in tool.parameters}
        if len(set(names.values())) < len(names):
            return tool
        return replace(tool, parameters={names[n]: p for n, p in tool.parameters.items()},
                       required=[names[n] for n in tool.required])

    tools = _map_tools(example, rename)
    by_name = {t.name: t for t in example.tools}
    answers = []
    for call in example.answers:
        old = list(by_name[call.name].parameters)
        new = list(next(t for t in tools if t.name == call.name).parameters)
        names = dict(zip(old, new))
        answers.append(Call(call.name, {names.get(k, k): v for k, v in call.arguments.items()}))
    if tools == example.tools:
        return None
    return replace(example, tools=tools, answers=answers)


def reordered(example: Example, rng: random.Random) -> Example | None:
    def shuffle(tool: Tool) -> Tool:
        items = list(tool.parameters.items())
        rng.shuffle(items)
        return replace(tool, parameters=dict(items))

    tools = _map_tools(example, shuffle)
    if [list(t.parameters) for t in tools] == [list(t.parameters) for t in example.tools]:
        return None
    return replace(example, tools=tools)


def _describe(change: Callable[[str, Param, bool], str]) -> Callable[[Example, random.Random], Example | None]:
    def variant(example: Example, rng: random.Random) -> Example | None:
        def rewrite(tool: Tool) -> Tool:
            return replace(tool, parameters={n: replace(p, description=change(n, p, n in tool.required))
                                             for n, p in tool.parameters.items()})
        tools = _map_tools(example, rewrite)
        return replace(example, tools=tools) if tools != example.tools else None
    return variant


def _first_sentence(name: str, param: Param, required: bool) -> str:
    return re.split(r"(?<=[.!?])\s", param.description.strip(), maxsplit=1)[0]


def _spelled_out(name: str, param: Param, required: bool) -> str:
    kind = f"array of {param.items.type}" if param.type == "array" and param.items else param.type
    text = param.description.strip().rstrip(".")
    return f"{text}. {kind.capitalize()}, {'required' if required else 'optional'}.".lstrip(". ")


short_descriptions = _describe(_first_sentence)
long_descriptions = _describe(_spelled_out)


def enum_in_words(example: Example, rng: random.Random) -> Example | None:
    def words(tool: Tool) -> Tool:
        params = {}
        for name, p in tool.parameters.items():
            if p.enum is not None:
                members = ", ".join(repr(m) for m in p.enum)
                p = replace(p, enum=None, description=f"{p.description.strip()} One of: {members}.".strip())
            params[name] = p
        return replace(tool, parameters=params)

    tools = _map_tools(example, words)
    return replace(example, tools=tools) if tools != example.tools else None


def no_defaults(example: Example, rng: random.Random) -> Example | None:
    def strip(tool: Tool) -> Tool:
        return replace(tool, parameters={n: replace(p, default=NO_DEFAULT) if n not in tool.required else p
                                         for n, p in tool.parameters.items()})

    tools = _map_tools(example, strip)
    return replace(example, tools=tools) if tools != example.tools else None


def nested(example: Example, rng: random.Random) -> Example | None:
    def wrap(tool: Tool) -> Tool:
        if not tool.parameters or NESTED_NAME in tool.parameters:
            return tool
        inner = Param("object", description="The call's settings.", properties=dict(tool.parameters),
                      required=list(tool.required))
        return replace(tool, parameters={NESTED_NAME: inner}, required=[NESTED_NAME])

    tools = _map_tools(example, wrap, only_called=True)
    wrapped = {t.name for t in tools if NESTED_NAME in t.parameters} - {t.name for t in example.tools if NESTED_NAME in t.parameters}
    if not wrapped:
        return None
    answers = [Call(c.name, {NESTED_NAME: dict(c.arguments)}) if c.name in wrapped else c for c in example.answers]
    return replace(example, tools=tools, answers=answers)


def batched(example: Example, rng: random.Random) -> Example | None:
    names = [c.name for c in example.answers]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if not repeated:
        return None
    name = rng.choice(repeated)
    tool = next(t for t in example.tools if t.name == name)
    item = Param("object", properties=dict(tool.parameters), required=list(tool.required))
    batch = Tool(f"{name}_batch", f"{tool.description.strip()} Takes several requests at once.".strip(),
                 {BATCH_NAME: Param("array", description="One object per request.", items=item)}, [BATCH_NAME])
    tools = [batch if t.name == name else t for t in example.tools]
    first = names.index(name)
    answers = [c for c in example.answers if c.name != name]
    answers.insert(first, Call(batch.name, {BATCH_NAME: [dict(c.arguments) for c in example.answers if c.name == name]}))
    return replace(example, tools=tools, answers=answers)


VARIANTS: dict[str, Callable[[Example, random.Random], Example | None]] = {
    "renamed": renamed, "reordered": reordered, "short-descriptions": short_descriptions,
    "long-descriptions": long_descriptions, "enum-in-words": enum_in_words, "no-defaults": no_defaults,
    "nested": nested, "batched": batched,
}


def schema_variants(examples: list[Example], fraction: float, seed: int, tries: int = 50) -> list[Example]:
    """Up to `fraction` of len(examples) variants of seeded requests with calls, the kinds taken in
    turn so each gets an equal share (a kind draws up to `tries` requests until one it applies to)."""
    rng = random.Random(seed)
    callers = [e for e in examples if e.answers]
    kinds = sorted(VARIANTS)
    made: dict[str, Example] = {}
    for turn in range(int(len(examples) * fraction) if callers else 0):
        kind = kinds[turn % len(kinds)]
        for _ in range(tries):
            example = rng.choice(callers)
            key = f"{example.id}~schema-{kind}"
            variant = None if key in made else VARIANTS[kind](example, random.Random(f"{seed}:{example.id}:{kind}"))
            if variant is not None:
                made[key] = replace(variant, id=key, source=f"augmented-{kind}")
                break
    return list(made.values())
