"""The contract every method (direct prompting, the cascade, the router) fulfils."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Tool


@dataclass
class Answer:
    """What a method returns for one request.

    `calls == []` means the method decided that no tool fits.
    `timings` holds named stage durations in seconds (e.g. {"prefill": .., "decode": ..}).
    """

    calls: list[Call]
    raw_text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # input tokens served from a reused KV cache (not run again)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # set when the model output could not be parsed into calls

    @property
    def latency(self) -> float:
        return sum(self.timings.values())


class Method(Protocol):
    name: str

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool]) -> Answer:
        """Answer one request given as chat messages ({"role", "content"}) and the offered tools."""
        ...
