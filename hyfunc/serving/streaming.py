"""Rendering an `Outcome` as OpenAI's response body, and the chunks of a streamed response.

A streamed response is: a first delta with the role; per call, one delta with ``index``, ``id``,
``type``, ``function.name`` and ``arguments: ""`` followed by argument fragments of the same
``index`` (sent as the templating decoder writes them, see `call_stream.CallStream`, which also
builds the non-streamed message's calls); text as content deltas, token by token; a final chunk
with the finish reason; a usage chunk when asked; ``data: [DONE]``.
"""
from __future__ import annotations

import json
from typing import Any

from hyfunc.serving.service import Outcome

DONE = b"data: [DONE]\n\n"


def usage(outcome: Outcome) -> dict[str, int]:
    """OpenAI's counts, plus `trimmed_messages` when the oldest messages were left out to fit the
    context (clients that do not know the field ignore it)."""
    counts = {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }
    return counts | ({"trimmed_messages": outcome.trimmed_messages} if outcome.trimmed_messages else {})


def completion_body(outcome: Outcome) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text, "refusal": None}
    if outcome.tool_calls:
        message["tool_calls"] = outcome.tool_calls
    return {
        "id": outcome.request_id,
        "object": "chat.completion",
        "created": outcome.created,
        "model": outcome.model,
        "choices": [{"index": 0, "message": message, "finish_reason": outcome.finish_reason, "logprobs": None}],
        "usage": usage(outcome),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """Chunks of one streamed response (the same id, created and model in each)."""

    def __init__(self, request_id: str, created: int, model: str):
        self.head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self.head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    def role(self) -> dict[str, Any]:
        return self.chunk({"role": "assistant"})

    def text(self, delta: str) -> dict[str, Any]:
        return self.chunk({"content": delta})

    def tool_call(self, delta: dict[str, Any]) -> dict[str, Any]:
        """One element of ``delta.tool_calls`` (from `CallStream`) as a chunk."""
        return self.chunk({"tool_calls": [delta]})

    def finish(self, outcome: Outcome) -> dict[str, Any]:
        return self.chunk({}, finish_reason=outcome.finish_reason)

    def usage(self, outcome: Outcome) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": usage(outcome)}


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode("utf-8")


def sse_comment(text: str) -> bytes:
    """An SSE comment line: clients skip it (the openai SDK's decoder does)."""
    return f": {' '.join(text.splitlines())}\n\n".encode("utf-8")
