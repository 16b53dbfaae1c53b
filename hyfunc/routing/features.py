"""Routing features of a request: what mining stores and what the router reads, computed by one
function so that training and serving can never disagree on a feature's definition.

- a sentence embedding of the request (all-MiniLM-L6-v2, `hyfunc.models.minilm`);
- scalars: request length, conversation turns, tool-set size, and, when the small path has already
  run, its number of calls, whether it refused, and its own confidence.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from hyfunc.formats.messages import conversation_text


def scalar_features(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
                    small_calls: Sequence[Any] | None = None,
                    small_confidence: float | None = None) -> dict[str, float]:
    """Log scales for counts and lengths: their effect on difficulty is multiplicative."""
    text = conversation_text(messages)
    features = {
        "request_chars_log": math.log1p(len(text)),
        "request_words_log": math.log1p(len(text.split())),
        "turns": float(sum(1 for m in messages if m.get("role") in ("user", "assistant", "tool"))),
        "tools_log": math.log1p(len(tools)),
    }
    if small_calls is not None:
        features["small_calls"] = float(len(small_calls))
        features["small_refused"] = float(len(small_calls) == 0)
    if small_confidence is not None:
        features["small_confidence"] = float(small_confidence)
    return features
