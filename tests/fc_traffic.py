"""Real-shaped traffic for the mining and router tests, built from the bundled fc-train (hyfunc/data/fc-train).

Each example becomes one logged request: its query as the user turn, its tools as OpenAI tools,
and its gold calls as the *large path's* answer (a stand-in for a large model that answers this
traffic correctly; the tests never read gold labels otherwise). The small path is
`ExtractiveSmallPath`, a deterministic rule stated here, not a list of labels.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any

from hyfunc.routing.mining import SmallOutput
from hyfunc.routing.record import ServedRequest
from hyfunc.data import FC_TRAIN
from hyfunc.formats.messages import conversation_text

def load_examples(n: int, seed: int = 0) -> list[dict]:
    """n examples drawn without replacement from all sources, in a seeded random order."""
    examples: list[dict] = []
    for path in sorted(FC_TRAIN.glob("*.jsonl")):
        examples.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    random.Random(seed).shuffle(examples)
    return examples[:n]


def served_from_example(example: dict, index: int, t0: float = 1_700_000_000.0) -> ServedRequest:
    return ServedRequest(
        messages=[{"role": "user", "content": example["query"]}],
        tools=[{"type": "function", "function": tool} for tool in example["tools"]],
        calls=example["answers"], path="cascade", models={"large": "gold-stand-in"},
        request_id=f"{example['id']}", created=t0 + index,
    )


def _copyable(value: Any, text: str) -> bool:
    if isinstance(value, bool) or value is None:
        return False  # a yes/no flag is inferred, never copied
    if isinstance(value, (int, float)):
        spelled = str(int(value)) if float(value).is_integer() else str(value)
        return re.search(rf"(?<![\w.]){re.escape(spelled)}(?![\w])", text) is not None
    if isinstance(value, str):
        return bool(value.strip()) and value.lower() in text.lower()
    return False  # lists and objects need restructuring


class ExtractiveSmallPath:
    """A small model that learned this traffic's answers but can only *copy* values: for a request
    it knows (by its text), it writes the first answer call with the arguments whose values appear
    literally in the request, and drops the rest; it writes no call when the answer has none.
    So it reproduces the large path exactly when the answer is at most one call and every value is
    a span of the request: a deterministic function of the request, and a realistic failure mode
    (multi-call requests, inferred or reformatted values)."""

    def __init__(self, examples: list[dict]) -> None:
        self._answers = {ex["query"]: ex["answers"] for ex in examples}

    def __call__(self, messages: list[dict], tools: list[dict]) -> SmallOutput:
        text = conversation_text(messages)
        answers = self._answers[text]
        if not answers:
            return SmallOutput([], confidence=0.9)
        first = answers[0]
        kept = {k: v for k, v in first["arguments"].items() if _copyable(v, text)}
        confidence = (len(kept) + 1) / (len(first["arguments"]) + 1)
        return SmallOutput([{"name": first["name"], "arguments": kept}], confidence=confidence)
