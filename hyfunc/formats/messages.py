"""Chat messages as the methods read them."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def request_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request a router judges: the last user turn (earlier turns only add context that the
    small path also reads; the last turn is what must be answered)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)
