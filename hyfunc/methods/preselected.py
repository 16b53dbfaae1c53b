"""Retrieve, then prompt: any method answering over only the tools a selector keeps.

A 4,000-tool library does not fit a prompt (~400k tokens against a 32k context), so a user who
wants the large model to answer directly over it puts a retriever in front. This is that baseline:
the small path's own selector (BM25 + MiniLM, hyfunc.cascade.selector; no large-model pass)
keeps the tools that fit the request, or none ("no tool fits": no call, the model is not run),
and the wrapped method reads only those.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from hyfunc.cascade.selector import ToolSelector
from hyfunc.formats.messages import conversation_text
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer, Method, answer_streaming, calls_text


class PreselectedMethod:
    """A `Method`: `inner` answers with the tools `selector` keeps for the request."""

    def __init__(self, inner: Method, selector: ToolSelector):
        self.inner, self.selector = inner, selector
        self.name = f"{inner.name}+selector"

    @property
    def backend(self) -> Any:
        """The wrapped method's model (run records name it)."""
        return getattr(self.inner, "backend", None)

    @property
    def config(self) -> dict:
        return {"inner": getattr(self.inner, "config", self.inner.name), "selector": self.selector.retriever.meta}

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool], on_text: Any = None) -> Answer:
        started = time.perf_counter()
        kept = self.selector.select(conversation_text(messages), tools)
        select_seconds = time.perf_counter() - started
        if not kept:
            if on_text is not None:
                on_text(calls_text([]))
            return Answer(calls=[], timings={"select": select_seconds}, details={"refused_by": "selector"})
        chosen = [tools[i] for i in kept]
        if on_text is not None:
            answer = answer_streaming(self.inner, messages, chosen, on_text)
        else:
            answer = self.inner.answer(messages, chosen)
        answer.timings = {"select": select_seconds, **answer.timings}
        answer.details["selected_tools"] = [t.name for t in chosen]
        return answer
