"""fc-train examples (`query`, `tools` as JSON Schema, `answers`; [] = no call), a stable split, a sample
balanced by call pattern and refusal examples made from the data itself and from off-topic requests."""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Union

from hyfunc.errors import InputError
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import SchemaError, Tool, parse_tools

PathLike = Union[str, Path]


@dataclass
class Example:
    id: str
    source: str
    query: str
    tools: list[Tool]
    answers: list[Call]  # empty: no tool should be called


def jsonl_files(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """The JSON Lines files that data paths name (a directory: its *.jsonl)."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
        if not item.exists():
            raise InputError(f"data path {str(item)!r} does not exist")
        # A directory means every *.jsonl in it, in name order so the result is reproducible.
        found = sorted(item.glob("*.jsonl")) if item.is_dir() else [item]
        if not found:
            raise InputError(f"data directory {str(item)!r} holds no .jsonl file")
        files += found
    return files


def load_examples(paths: PathLike | Iterable[PathLike]) -> list[Example]:
    """Read JSON Lines files (or directories of them); errors name the file and line."""
    examples: list[Example] = []
    seen: set[str] = set()
    for path in jsonl_files(paths):
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    example = _read(json.loads(line), default_source=path.stem)
                except (ValueError, KeyError, TypeError, SchemaError) as e:
                    raise InputError(f"{path}:{lineno}: {e}") from None
                # ids key the split: a duplicate would silently land on one side twice
                if example.id in seen:
                    raise InputError(f"{path}:{lineno}: duplicate example id {example.id!r}")
                seen.add(example.id)
                examples.append(example)
    return examples


def _read(record: dict, default_source: str) -> Example:
    tools = parse_tools(record["tools"])
    names = {t.name for t in tools}
    answers = []
    for a in record["answers"]:
        if a["name"] not in names:
            raise ValueError(f"answer calls {a['name']!r}, which is not among the tools")
        if not isinstance(a.get("arguments", {}), dict):
            raise ValueError(f"answer {a['name']!r}: arguments must be an object")
        answers.append(Call(a["name"], dict(a.get("arguments", {}))))
    return Example(
        id=str(record["id"]),
        source=str(record.get("source", default_source)),
        query=str(record["query"]),
        tools=tools,
        answers=answers,
    )


def split_examples(
    examples: Iterable[Example], val_fraction: float = 0.1, salt: str = "hyfunc"
) -> tuple[list[Example], list[Example]]:
    """(train, validation) by a hash of each id: stable across runs, machines and added data
    (Python's hash() is salted per process, so sha256)."""
    train, val = [], []
    for ex in examples:
        digest = hashlib.sha256(f"{salt}:{ex.id}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
        (val if u < val_fraction else train).append(ex)
    return train, val


def call_pattern(example: Example) -> str:
    """What an example teaches about the call list: "none", "single", "distinct" (several calls of
    different tools) or "repeated" (one tool called several times, BFCL's parallel case)."""
    names = [c.name for c in example.answers]
    if not names:
        return "none"
    if len(names) == 1:
        return "single"
    return "repeated" if len(set(names)) < len(names) else "distinct"


def sample_by_pattern(items: list, n: int, seed: int, pattern=call_pattern) -> list:
    """A seeded uniform sample of `n` items in which every call pattern gets at least an equal
    share (n / number of patterns, or all its items if it has fewer): short patterns are topped up
    at the expense of the most common ones. Returned in the items' original order. fc-train has
    few repeated calls and refusals: a plain sample would leave them barely taught."""
    if n >= len(items):
        return list(items)
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(items)), n))
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(pattern(item), []).append(i)
    quota = n // len(groups)
    for members in groups.values():
        have = [i for i in members if i in chosen]
        missing = [i for i in members if i not in chosen]
        chosen.update(rng.sample(missing, max(0, min(quota, len(members)) - len(have))))
    while len(chosen) > n:  # give back from the largest pattern
        largest = max(groups.values(), key=lambda m: sum(i in chosen for i in m))
        chosen.discard(rng.choice([i for i in largest if i in chosen]))
    return [items[i] for i in sorted(chosen)]


def off_topic_requests() -> list[Example]:
    """Requests that ask for no tool at all, as no-call examples without tools: the first user turn
    of every English conversation of the ChatterBot corpus (`chatterbot-corpus` on PyPI, BSD-3:
    small talk, trivia, jokes, coding and tech-support questions), deduplicated. fc-train's requests
    all ask for some tool, so without these a request like "Tell me a joke." shown a list of
    everyday tools was answered with a call. Ids hash the text: `split_examples` splits them stably."""
    import yaml  # the `train` extra, like the corpus

    texts: set[str] = set()
    for path in sorted((resources.files("chatterbot_corpus") / "data" / "english").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yml"):
            for conversation in yaml.safe_load(path.read_text(encoding="utf-8"))["conversations"]:
                if isinstance(conversation, list) and conversation and isinstance(conversation[0], str) and conversation[0].strip():
                    texts.add(conversation[0].strip())
    return [
        Example(f"chatterbot-{hashlib.sha256(text.encode()).hexdigest()[:12]}", "chatterbot-corpus", text, [], [])
        for text in sorted(texts)
    ]


def augment_refusals(examples: list[Example], fraction: float, seed: int) -> list[Example]:
    """No-call examples, `fraction` of len(examples) of each kind:

    - near miss: a request shown its own tool list without the tools its answer calls (same domain,
      close names: BFCL's irrelevance cases look like this);
    - unrelated: a request shown only the tools of another example that share no name with its own.

Off-topic requests are not among them: the off-topic gate (off_topic.py) learns those apart.

    Ids name what the example is made of, so cached embeddings stay valid across runs."""
    rng = random.Random(seed)
    callers = [e for e in examples if e.answers]
    extra: dict[str, Example] = {}
    near = [e for e in callers if any(t.name not in {c.name for c in e.answers} for t in e.tools)]
    for ex in rng.sample(near, min(len(near), int(len(examples) * fraction))):
        gold = {c.name for c in ex.answers}
        extra[f"{ex.id}~without-gold"] = Example(
            f"{ex.id}~without-gold", "augmented-near-miss", ex.query, [t for t in ex.tools if t.name not in gold], []
        )
    for _ in range(int(len(examples) * fraction)):
        ex, other = rng.sample(callers, 2)
        own = {t.name for t in ex.tools}
        tools = [t for t in other.tools if t.name not in own]
        if tools:
            key = f"{ex.id}~tools-of~{other.id}"
            extra[key] = Example(key, "augmented-unrelated", ex.query, tools, [])
    return examples + list(extra.values())


def repeated_examples(pool: list[Example], n: int, seed: int) -> list[Example]:
    """Up to `n` repeated-call examples (BFCL's parallel case) built from the data itself: each joins
    two or three single-call requests of `pool` for the same tool (same schema), asked one after the
    other; its answer is their calls in that order (`n` seeded draws; a draw that repeats an earlier
    one or would repeat a call is dropped). fc-train has few requests that call one tool
    several times; these teach the small model one call per thing asked, not one call with the
    values packed together. Ids name the parts, so cached embeddings stay valid across runs."""
    rng = random.Random(seed)
    groups: dict[str, list[Example]] = {}
    for ex in pool:
        if len(ex.answers) == 1:
            tool = next(t for t in ex.tools if t.name == ex.answers[0].name)
            groups.setdefault(json.dumps(tool.to_json_schema(), sort_keys=True), []).append(ex)
    pools = [members for members in groups.values() if len(members) >= 2]
    made: dict[str, Example] = {}
    for _ in range(n if pools else 0):
        members = rng.choice(pools)
        parts = rng.sample(members, 3 if len(members) >= 3 and rng.random() < 1 / 3 else 2)
        calls = [c for p in parts for c in p.answers]
        if len({json.dumps([c.name, c.arguments], sort_keys=True) for c in calls}) < len(calls):
            continue  # the same call twice is what the decoder's loop guard takes back
        key = "~and~".join(p.id for p in parts)
        tools = list({t.name: t for p in parts for t in p.tools}.values())
        made[key] = Example(key, "augmented-repeated", " ".join(p.query.strip() for p in parts), tools, calls)
    return list(made.values())
