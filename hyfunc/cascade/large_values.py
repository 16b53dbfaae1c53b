"""Scalar argument values written by the large model, from its own state after the soft-token pass.

The small model, fine-tuned on fc-train (whose values mostly copy the request's words), writes
"Boston" where a parameter's description asks for "City, State" ("Boston, MA"), and it misses
values the request only implies. The large model has already read [instruction + tools +
request] to produce the soft token; its KV state is there. Continued with the answer written so
far up to a value, it writes the value itself, reading the description:

- free strings: greedily, to the closing quote (`string`). Where the parameter's description
  shows a form of two parts by quoted examples ("in the format of 'City, State', such as 'San
  Francisco, CA'") and the value has no separator ("San Francisco", copied from the request), the
  model goes on from the value with the form's separator ("San Francisco," then " CA"); the longer
  value is kept if it is then in the form; dates get two-digit months and days where the examples
  show 'YYYY-MM-DD' (`described_forms`);
- enum members: the member whose JSON text it finds likeliest (`choice`), when asked;
- numbers: greedily, to the first character a JSON number cannot hold (`number`), when asked.
  The large model reads "5,10 and 15" as 510 (a comma between digits being, to it, a thousands
  separator); a number that joins the items of such a list, whose commas cannot be thousands
  separators, is taken as the list's first item (grounding.listed_item); the items' own calls follow.

The small model keeps every structural choice (which tools, how many calls, which optional keys,
how many array items) and every value the writer declines. Which kinds the large model writes is
the writer's `kinds`; the cascade's options set it.

Drafts make a value cost one or two passes of the large model instead of one per token, and
leave it as it is (up to float rounding of the batched pass): drafted tokens run through the
model in one pass and each is kept only while it is the large model's own greedy choice. The
first draft is the small model's own value (`model_drafts`: the decoder lets it write the value
first, unpublished, and keeps its text where the large model writes the same); then, as the
templating decoder does for the small model (templating/drafting.py), the request's text after
the value so far.

One writer per request. It follows the answer text incrementally: only text it has not seen is
run through the large model (a repeat-guard rewind that took text back makes it fork the
prompt's state again). Engine-independent: `forward`, `fork`, `encode`, `decode` and a cache
that can `crop`. Generated tokens are decoded together, never one by one: a character of
several UTF-8 bytes may span tokens (one by one, "广东" came out as "��东").
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Sequence

import torch

from hyfunc.cascade.templating.drafting import copy_draft_ids
from hyfunc.formats.grounding import form_separators, listed_item, padded_dates, separators_of
from hyfunc.models.base import BackendBase, StepOutput

KINDS = ("string", "choice", "number")
#: Characters a JSON number may hold; the first other one ends the large model's number.
_NUMBER_CHARS = set("-+.eE0123456789")
_JSON_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


class LargeValueWriter:
    """The templating decoder's `ValueWriter` (templating/decoder.py): each method gets the answer
    text so far (up to a string's opening quote, or up to where a number or an enum member
    starts) and returns the value, or None to let the small model write it."""

    def __init__(
        self, backend: BackendBase, prompt_state: StepOutput, max_tokens: int = 48,
        kinds: Sequence[str] = ("string",), draft_source: str = "", max_draft_tokens: int = 24,
        model_drafts: bool = False, request: str = "", described_forms: bool = True,
    ):
        """`draft_source`: the text values are likely copied from (the request; no copy drafts when
        empty or `max_draft_tokens` is 0). `model_drafts`: the decoder passes the decoding model's
        own value as the first draft (templating/walker.py)."""
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown value kinds {sorted(unknown)}; known: {list(KINDS)}")
        self.backend, self.prompt_state, self.max_tokens = backend, prompt_state, max_tokens
        self.kinds = frozenset(kinds)
        self.draft_source, self.max_draft_tokens = draft_source, max_draft_tokens
        self.model_drafts = model_drafts
        self.request = request  # numbers are read against its lists (grounding.listed_item)
        self.described_forms = described_forms  # strings are brought into their described form (`string`)
        self._cache: Any = None
        self._seen = ""  # answer text the cache holds, after the prompt
        self._logits = None  # the next-token logits after `_seen`
        self.seconds = 0.0
        self.values = 0  # values written (or chosen)
        self.tokens = 0  # tokens the large model generated or scored
        self.passes = 0  # forward passes of the large model
        self.drafted = 0  # drafted tokens run through it, kept or not

    def _follow(self, text: str, draft: Sequence[int] = ()) -> list[tuple[int, torch.Tensor]]:
        """Bring the cache to `text`, running `draft` after it in the same pass (see `_run`)."""
        if self._cache is None or not text.startswith(self._seen):
            self._cache, self._seen, self._logits = self.backend.fork(self.prompt_state.cache), "", self.prompt_state.logits
        new = text[len(self._seen):]
        ahead = self._run(self.backend.encode(new) if new else [], draft)
        self._seen = text
        return ahead

    def _run(self, ids: Sequence[int], draft: Sequence[int]) -> list[tuple[int, torch.Tensor]]:
        """Run `ids` then `draft` in one pass; `_logits` become those after `ids`. Returns the
        drafted tokens, each with the logits after it (they stay in the cache after `ids`)."""
        ids, draft = list(ids), list(draft)
        if not ids and not draft:
            return []
        keep = len(draft) + 1 if ids else len(draft)
        step = self.backend.forward(ids=ids + draft, cache=self._cache, logits_to_keep=keep)
        rows = step.tail_logits if keep > 1 else step.logits[None]
        if not ids:  # the logits before the draft's first token are the current ones
            rows = torch.cat([self._logits[None], rows])
        self._cache, self._logits = step.cache, rows[0]
        self.passes += 1
        self.drafted += len(draft)
        return list(zip(draft, rows[1:]))

    def _timed(self, write: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return write()
        finally:
            self.seconds += time.perf_counter() - start

    def string(self, text_so_far: str, draft: str | None = None, examples: Sequence[str] = ()) -> str | None:
        """A free string's content; `text_so_far` ends with its opening quote. `draft`: the
        content as the decoding model wrote it (JSON-escaped), to check first. `examples`: those
        of the form the parameter's description shows (grounding.described_examples)."""
        if "string" not in self.kinds:
            return None
        value = self._timed(lambda: self._generate(
            text_so_far, _string_end, _string_value, lambda text: ("string", text), draft or ""))
        if value is None or not self.described_forms or not examples:
            return value
        value = padded_dates(value, examples)
        forms = form_separators(examples)
        # Only forms of two parts ("City, State", "HH:MM"): a form of more ('Twitter, Facebook,
        # Instagram') may be a list, which a value of one item is not wrong to be.
        if any(len(f) != 1 for f in forms) or separators_of(value):
            return value
        separator = min(forms)
        head = text_so_far + json.dumps(value, ensure_ascii=False)[1:-1] + separator
        more = self._timed(lambda: self._generate(head, _string_end, _string_value, lambda text: ("string", text)))
        longer = value + separator + more if more is not None else None
        return longer if longer is not None and separators_of(longer) in forms else value

    def number(self, text_so_far: str, integer: bool, draft: str | None = None) -> str | None:
        """A number's JSON text, when it is one (an integer for `integer`). `draft`: the number as
        the decoding model wrote it, to check first."""
        if "number" not in self.kinds:
            return None
        head, gap = _split_gap(text_so_far)

        def value_of(text: str) -> str | None:
            return _number_value(text[len(gap):], integer) if text.startswith(gap) else None

        def so_far(text: str) -> tuple[str, str] | None:
            return ("number", text[len(gap):]) if text.startswith(gap) else None

        value = self._timed(lambda: self._generate(
            head, lambda text: _number_end(text, gap), value_of, so_far, gap + draft if draft else ""))
        return listed_item(value, self.request) if value is not None else None

    def choice(self, text_so_far: str, options: Sequence[str]) -> int | None:
        """The index of the option (JSON texts: enum members) whose tokens the large model finds
        likeliest after `text_so_far` (sum of log-probabilities)."""
        if "choice" not in self.kinds or len(options) < 2:
            return None
        return self._timed(lambda: self._choose(text_so_far, options))

    def _choose(self, text_so_far: str, options: Sequence[str]) -> int:
        head, gap = _split_gap(text_so_far)
        self._follow(head)
        scores = []
        for option in options:
            ids = self.backend.encode(gap + option)
            step = self.backend.forward(ids=ids, cache=self._cache, logits_to_keep=len(ids))
            self._cache.crop(-len(ids))  # scored, then forgotten: the template writes the chosen one
            self.passes += 1
            rows = self._logits[None] if len(ids) == 1 else torch.cat([self._logits[None], step.tail_logits[:-1]])
            scores.append(float(torch.log_softmax(rows.float(), -1)[range(len(ids)), ids].sum()))
            self.tokens += len(ids)
        self.values += 1
        return max(range(len(options)), key=scores.__getitem__)

    def _generate(
        self, text_so_far: str, end_of: Callable[[str], int | None], value_of: Callable[[str], Any],
        so_far: Callable[[str], tuple[str, str] | None], first_draft: str = "",
    ) -> Any:
        """Greedy tokens after `text_so_far` until `end_of(text)` finds where the value's text
        ends; `value_of(text)` then reads the value (None: not a usable one). `so_far(text)`:
        (kind, the value's text) to look up copy drafts with, None for none. `first_draft`: text
        run as a draft in the pass that brings the cache to `text_so_far`."""
        draft = self.backend.encode(first_draft)[: self.max_tokens] if first_draft else []
        # drafted tokens in the cache after `ids`, with the logits after each
        ahead = self._follow(text_so_far, draft)
        before, logits_before = self._cache.get_seq_length() - len(ahead), self._logits
        ids: list[int] = []  # generated tokens whose text is in the cache
        try:
            for _ in range(self.max_tokens):
                tid = int(self._logits.argmax())
                self.tokens += 1
                if tid in self.backend.eos_ids:
                    break
                text = self.backend.decode(ids + [tid])
                end = end_of(text)
                if end is not None:
                    # The ending token is not run: the template decides what follows the value, so
                    # the next value's call feeds the text from here on.
                    self._seen = text_so_far + self.backend.decode(ids)
                    value = value_of(text[:end])
                    if value is not None:
                        self.values += 1
                    return value
                ids.append(tid)
                if ahead and ahead[0][0] == tid:  # the draft's next token is the model's own choice
                    self._logits = ahead.pop(0)[1]
                    continue
                self._drop(ahead)
                ahead = self._run([tid], self._draft(so_far(text)))
            grown = self._cache.get_seq_length() - before
            if grown:
                self._cache.crop(-grown)  # no value within the cap: forget the attempt
            ahead = []
            self._seen, self._logits = text_so_far, logits_before
            return None
        finally:
            self._drop(ahead)

    def _draft(self, value: tuple[str, str] | None) -> list[int]:
        """Tokens likely to continue `value` (kind, text so far): the request's text after it."""
        if value is None or not self.draft_source or self.max_draft_tokens < 1:
            return []
        draft = copy_draft_ids(self.backend.encode, value[1], self.draft_source, value[0])
        return draft[0][: self.max_draft_tokens] if draft is not None else []

    def _drop(self, ahead: list) -> None:
        """Take drafted tokens that were not kept back out of the cache."""
        if ahead:
            self._cache.crop(-len(ahead))
            ahead.clear()


def _string_end(text: str) -> int | None:
    """Where an unescaped `"` closes a JSON string whose content is `text`."""
    escaped = False
    for i, ch in enumerate(text):
        if ch == '"' and not escaped:
            return i
        escaped = ch == "\\" and not escaped
    return None


def _string_value(content: str) -> str | None:
    try:
        value = json.loads('"' + content + '"')
    except json.JSONDecodeError:
        return None
    return value or None  # an empty value: the small model decides


def _split_gap(text: str) -> tuple[str, str]:
    """(text, its trailing spaces): what follows `": ` or `, ` is written or scored with the
    space in front, as the model's tokenizer spells it (" -3" is one token and "3" another). Fed
    a lone space token, the large model wrote -3 as 3."""
    head = text.rstrip(" ")
    return head, text[len(head):]


def _number_end(text: str, gap: str = "") -> int | None:
    """Where a number written after `gap` ends in `text` (0: text that does not start with `gap`)."""
    if not text.startswith(gap):
        return None if gap.startswith(text) else 0
    return next((i for i in range(len(gap), len(text)) if text[i] not in _NUMBER_CHARS), None)


def _number_value(text: str, integer: bool) -> str | None:
    if not _JSON_NUMBER.fullmatch(text) or (integer and not re.fullmatch(r"-?\d+", text)):
        return None
    return text
