"""Free string values written by the large model, from its own state after the soft-token pass.

The small model, fine-tuned on fc-train (whose values mostly copy the request's words), writes
"Boston" where a parameter's description asks for "City, State" ("Boston, MA"), and it misses
values the request only implies. The large model has already read [instruction + tools +
request] to produce the soft token; its KV state is there. Continued with the answer written so
far up to a string value's opening quote, it writes the value itself, reading the description.
The small model keeps every structural choice (which tools, how many calls, which optional keys)
and every number, boolean and enum value.

One writer per request. It follows the answer text incrementally: only text it has not seen is
run through the large model (a repeat-guard rewind that took text back makes it fork the
prompt's state again). Engine-independent: `forward`, `fork`, `encode`, `decode` and a cache
that can `crop`.
"""
from __future__ import annotations

import json
import time
from typing import Any

from hyfunc.models.base import BackendBase, StepOutput


class LargeValueWriter:
    """`writer(text_so_far)` -> the string value's content, or None (let the small model write
    it). `text_so_far` is the answer text up to and including the value's opening quote."""

    def __init__(self, backend: BackendBase, prompt_state: StepOutput, max_tokens: int = 48):
        self.backend, self.prompt_state, self.max_tokens = backend, prompt_state, max_tokens
        self._cache: Any = None
        self._seen = ""  # answer text the cache holds, after the prompt
        self._logits = None  # the next-token logits after `_seen`
        self.seconds = 0.0
        self.values = 0  # values written
        self.tokens = 0  # tokens the large model generated

    def _follow(self, text: str) -> None:
        if self._cache is None or not text.startswith(self._seen):
            self._cache, self._seen = self.backend.fork(self.prompt_state.cache), ""
        new = text[len(self._seen):]
        if new:
            step = self.backend.forward(ids=self.backend.encode(new), cache=self._cache)
            self._cache, self._logits, self._seen = step.cache, step.logits, text

    def __call__(self, text_so_far: str) -> str | None:
        start = time.perf_counter()
        try:
            return self._write(text_so_far)
        finally:
            self.seconds += time.perf_counter() - start

    def _write(self, text_so_far: str) -> str | None:
        self._follow(text_so_far)
        before, logits_before = self._cache.get_seq_length(), self._logits
        fed = ""  # content whose tokens are in the cache
        for _ in range(self.max_tokens):
            tid = int(self._logits.argmax())
            piece = self.backend.decode([tid])
            self.tokens += 1
            end = _closing_quote(fed, piece)
            if end is not None:
                # The closing token is not run: the template decides what follows the quote, so
                # the next value's call feeds the text from here on.
                self._seen = text_so_far + fed
                try:
                    value = json.loads('"' + fed + piece[:end] + '"')
                except json.JSONDecodeError:
                    return None
                self.values += 1
                return value or None  # an empty value: the small model decides
            if tid in self.backend.eos_ids:
                break
            fed += piece
            step = self.backend.forward(ids=[tid], cache=self._cache)
            self._cache, self._logits = step.cache, step.logits
        grown = self._cache.get_seq_length() - before
        if grown:
            self._cache.crop(-grown)  # no closed value within the cap: forget the attempt
        self._seen, self._logits = text_so_far, logits_before
        return None


def _closing_quote(content: str, piece: str) -> int | None:
    """Where in `piece` an unescaped `"` closes a JSON string whose content so far is `content`."""
    escaped = (len(content) - len(content.rstrip("\\"))) % 2 == 1
    for i, ch in enumerate(piece):
        if ch == '"' and not escaped:
            return i
        escaped = ch == "\\" and not escaped
    return None
