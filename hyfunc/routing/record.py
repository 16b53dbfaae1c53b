"""One served request and its outcome: what the server hands to the traffic log.

The server builds one `ServedRequest` per answered request, in one place, and passes it to a
`TrafficSink`; the traffic store (SQLite or PostgreSQL) is one such sink. Keeping the record a
plain dataclass lets the serving layer and the store evolve without importing each other.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class ServedRequest:
    messages: list[dict]  # the conversation as received (OpenAI chat messages)
    tools: list[dict]  # the offered tools as OpenAI tool dicts
    calls: list[dict]  # the answer's calls: [{"name": ..., "arguments": {...}}]; [] = no call
    text: str = ""  # the text reply, when the answer is text
    path: str = "cascade"  # which path answered: cascade | direct | small | large
    models: dict[str, str] = field(default_factory=dict)  # role -> model / artifact version
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    input_tokens: int = 0
    output_tokens: int = 0
    injected_tokens: int = 0
    error: str | None = None
    request_id: str = field(default_factory=lambda: f"req_{uuid.uuid4().hex}")
    created: float = field(default_factory=time.time)


class TrafficSink(Protocol):
    def record(self, request: ServedRequest) -> None:
        """Take one served request; must neither block the caller for long nor raise."""
        ...
