"""fc-train examples (`query`, `tools` as JSON Schema, `answers`; [] = no call) and a stable split."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

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


def _files(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
        # A directory means every *.jsonl in it, in name order so the result is reproducible.
        files += sorted(item.glob("*.jsonl")) if item.is_dir() else [item]
    return files


def load_examples(paths: PathLike | Iterable[PathLike]) -> list[Example]:
    """Read JSON Lines files (or directories of them); errors name the file and line."""
    examples: list[Example] = []
    seen: set[str] = set()
    for path in _files(paths):
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    example = _read(json.loads(line), default_source=path.stem)
                except (ValueError, KeyError, TypeError, SchemaError) as e:
                    raise ValueError(f"{path}:{lineno}: {e}") from None
                # ids key the split: a duplicate would silently land on one side twice
                if example.id in seen:
                    raise ValueError(f"{path}:{lineno}: duplicate example id {example.id!r}")
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
