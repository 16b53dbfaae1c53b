"""Rendering an `Outcome` as OpenAI's response body or as its stream of chunks.

Both renderings come from the same `Outcome`, so assembling the chunks (role, then per call one
delta with ``index``, ``id``, ``type``, ``function.name`` and ``arguments: ""`` followed by argument
fragments of the same ``index``; text as content deltas) gives exactly the non-streamed message.

Text replies are streamed token by token as the model writes them. Calls are streamed once the
answer is complete: streaming argument values as the templating decoder writes them needs a hook
inside the decoder, which is being refactored; the fragments here are the finished JSON split at
its string literals, so a client sees the same wire shape either way.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

from hyfunc.serving.service import Outcome

DONE = b"data: [DONE]\n\n"

# Splits a JSON text into string literals and the runs between them; the pieces concatenate back.
_FRAGMENT = re.compile(r'"(?:\\.|[^"\\])*"|[^"]+')


def usage(outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


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


def argument_fragments(arguments: str) -> list[str]:
    """``{"city": "Paris", "n": 2}`` -> ``['{', '"city"', ': ', '"Paris"', ', ', '"n"', ': 2}']``."""
    pieces = _FRAGMENT.findall(arguments)
    if "".join(pieces) != arguments:  # cannot happen for JSON; never send a distorted value
        return [arguments]
    return pieces


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

    def calls(self, tool_calls: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for index, call in enumerate(tool_calls):
            function = call["function"]
            yield self.chunk({"tool_calls": [{
                "index": index, "id": call["id"], "type": "function",
                "function": {"name": function["name"], "arguments": ""},
            }]})
            for piece in argument_fragments(function["arguments"]):
                yield self.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def finish(self, outcome: Outcome) -> dict[str, Any]:
        return self.chunk({}, finish_reason=outcome.finish_reason)

    def usage(self, outcome: Outcome) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": usage(outcome)}


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode("utf-8")
