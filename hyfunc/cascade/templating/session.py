"""The decode loop of the templating decoder: one emission state over the small model's KV cache.

A `Session` buffers injected text, runs it through the model with the next generated token in one
pass, makes the three kinds of decision (a masked `step`, a `peek` at several token sets, a
`choose` among strings), verifies drafts (`drafting.py`) and takes back what a rejected draft or a
rewind put in the cache. In teacher mode (training targets) no model runs: decisions follow the
gold text.

Streaming (`on_text`): the emitted text is passed on piece by piece as soon as it is *final*, i.e.
can no longer be taken back. A value the model drafts for the value writer is kept back until the
writer has checked it (`keep_back`; `Walker.written_value`). Otherwise only the repeat guard takes
text back (it rewinds to a `mark` made before a list separator, see `Walker._closed_on_repeat`),
and only when the list item after that mark turns out to equal an earlier item word for word. So
each such mark is registered as a `Hold`; text from a live hold on is kept back, and a hold dies as
soon as its item's text (up to the next inner hold) is a prefix of no earlier item, or when its
item is checked. The cost in
latency: the separator and the start of a second or later call (or array item) wait until they
differ from every earlier one (for calls, usually at the name or the first value), and a call or
item that repeats an earlier one word for word waits until it is closed.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence

import torch

from hyfunc.cascade.templating.drafting import DECISION, Follow, copy_draft_ids
from hyfunc.cascade.templating.vocab import Vocab
from hyfunc.models.backend import StepOutput

if TYPE_CHECKING:
    from hyfunc.cascade.templating.decoder import TemplateDecoder


class TemplateError(ValueError):
    """Gold calls that the template cannot produce (unknown tool, invalid argument, ...)."""


@dataclass(eq=False)  # holds are compared by identity
class Hold:
    """A mark the repeat guard may rewind to: the text from it on is not final yet."""

    parts: int  # len(text_parts) at the mark
    chars: int  # len(text) at the mark
    written: list[str]  # the earlier items of the list (the walker's list, appended as it goes)
    item_start: int | None = None  # where the item after the separator starts, once it has started


class GaveUp(Exception):
    """The lowest generated-token probability fell below the session's `give_up_below`: the
    minimum can only fall further, so a caller that would discard such an output (a router
    escalating doubtful answers) is spared the rest of the decode."""

    def __init__(self, min_probability: float):
        super().__init__(f"a generated token's probability fell to {min_probability:.4f}")
        self.min_probability = min_probability


class ValueWriter(Protocol):
    """Writes scalar argument values instead of the decoding model (the cascade's large model:
    large_values.py). Each method gets the answer text so far and returns None to decline.
    With `model_drafts`, strings and numbers also get `draft`: the value as the decoding model
    wrote it (unpublished, taken back where the writer's value differs; Walker.written_value)."""

    model_drafts: bool

    def string(self, text_so_far: str, draft: str | None = None, examples: Sequence[str] = ()) -> str | None:
        """A free string's content; `text_so_far` ends with its opening quote; `examples`: those of
        the form the parameter's description shows (grounding.described_examples)."""

    def choice(self, text_so_far: str, options: Sequence[str]) -> int | None:
        """Which enum member (options: their JSON texts) follows `text_so_far`."""

    def number(self, text_so_far: str, integer: bool, draft: str | None = None) -> str | None:
        """A number's JSON text to follow `text_so_far`."""


class Session:
    def __init__(
        self, dec: TemplateDecoder, vocab: Vocab, step: StepOutput | None, teacher: bool, draft_source: str = "",
        on_text: Callable[[str], None] | None = None, give_up_below: float = 0.0,
        write_value: ValueWriter | None = None,
    ):
        self.dec = dec
        # Writes scalar argument values instead of the model, or declines (the cascade's large
        # model: large_values.py).
        self.write_value = None if teacher else write_value
        self.give_up_below = give_up_below  # see GaveUp
        self.vocab = vocab
        self.teacher = teacher
        self.backend = dec.backend
        self.cache = step.cache if step is not None else None
        self.logits = self._fit(step.logits) if step is not None else None
        self.text_parts: list[str] = []
        self.ids: list[int] = []
        self.generated: list[bool] = []
        self.decision: list[bool] = []
        self.pending_text = ""
        self.feed: list[int] = []
        self.decision_pending = False
        self.forward_calls = 0
        self.forward_seconds = 0.0
        # Copy drafting (see `_draft`): the kind of scalar value being written ("string" or
        # "number"; None elsewhere), its text so far, and the drafted tokens already in the
        # cache, each with the logits after it.
        self.draft_source = draft_source
        self.draft_kind: str | None = None
        self.value_so_far = ""
        self.draft_follow = DECISION
        self.choice_draft: list[int] = []  # the expected tokens of a choice being made (see `choose`)
        self.ahead: list[tuple[int, torch.Tensor]] = []
        self.drafted = 0
        self.accepted = 0
        self.on_text = None if teacher else on_text
        self.holds: list[Hold] = []  # live holds, outermost (earliest) first
        self.published = 0  # text_parts already passed to on_text
        self.rewinds = 0  # repeats taken back by the guard
        self.unpublished = 0  # > 0: text is kept back from on_text (a value drafted for the writer)
        self.min_probability = 1.0  # lowest probability of a generated token among its allowed set

    # -- emission --------------------------------------------------------------------------
    def _append(self, tid: int, generated: bool) -> None:
        self.ids.append(tid)
        self.generated.append(generated)
        self.decision.append(generated or self.decision_pending)
        self.decision_pending = False
        if self.ahead and not self.feed and tid == self.ahead[0][0]:
            _, self.logits = self.ahead.pop(0)  # already in the cache: no pass of its own
            self.accepted += 1
            return
        self._drop_ahead()
        self.feed.append(tid)

    def mark(self) -> tuple:
        """The emission state, to `rewind` to later (model mode)."""
        self._flush_text()  # injected text may still match drafted tokens: keep those
        return (
            len(self.ids), len(self.text_parts), self.pending_text, list(self.feed), self.logits,
            self.cache.get_seq_length() - len(self.ahead), self.decision_pending,
        )

    def rewind(self, mark: tuple, repeat: bool = True) -> None:
        """Take back everything emitted since `mark`, from the output and from the KV cache;
        `repeat`: the repeat guard's (counted in `rewinds`), not a value the writer replaced."""
        n_ids, n_parts, self.pending_text, feed, self.logits, cached, self.decision_pending = mark
        if n_parts < self.published:  # a broken invariant (a bug, not a model failure): a client has this text
            raise AssertionError("templating: a rewind would take back text already streamed")
        self.holds = [h for h in self.holds if h.parts < n_parts]
        self.rewinds += repeat
        self._drop_ahead()
        del self.ids[n_ids:], self.generated[n_ids:], self.decision[n_ids:], self.text_parts[n_parts:]
        self.feed = list(feed)
        if (extra := self.cache.get_seq_length() - cached) > 0:
            self.cache.crop(-extra)

    # -- streaming -------------------------------------------------------------------------
    def hold(self, mark: tuple, written: list[str]) -> Hold:
        """Keep the text from `mark` on back until the item after it cannot repeat one of `written`."""
        parts = mark[1]
        hold = Hold(parts, sum(len(p) for p in self.text_parts[:parts]), written)
        self.holds.append(hold)
        return hold

    def release(self, hold: Hold | None) -> None:
        """The item after `hold` was checked (or the list closed): no rewind to it any more."""
        if hold is not None and hold in self.holds:
            self.holds.remove(hold)
            self._publish()

    def _final_parts(self) -> int:
        """How many text parts are final: those before the earliest hold that may still fire."""
        if not self.holds:
            return len(self.text_parts)
        text = self.text
        end = len(text)
        for hold in reversed(list(self.holds)):  # innermost first: its mark bounds the outer items' stable text
            if hold.item_start is not None and not any(w.startswith(text[hold.item_start:end]) for w in hold.written):
                # Inner rewinds only cut text after `end`: the item already differs from every earlier one.
                self.holds.remove(hold)
                continue
            end = hold.chars
        return self.holds[0].parts if self.holds else len(self.text_parts)

    @contextmanager
    def keep_back(self) -> Iterator[None]:
        """Text emitted inside is not streamed until the block ends (it may be taken back)."""
        self.unpublished += 1
        try:
            yield
        finally:
            self.unpublished -= 1
            self._publish()

    def _publish(self) -> None:
        if self.on_text is None or self.unpublished:
            return
        final = self._final_parts()
        if final > self.published:
            piece = "".join(self.text_parts[self.published:final])
            self.published = final
            if piece:
                self.on_text(piece)

    def _drop_ahead(self) -> None:
        """Remove the drafted tokens that were not emitted from the cache."""
        if self.ahead:
            self.cache.crop(-len(self.ahead))
            self.ahead = []

    @contextmanager
    def drafting(self, kind: str, follow: Follow = DECISION) -> Iterator[None]:
        """While a string's content or a number is written, drafts may be copied for it;
        `follow`: what the decoder feeds after the value (see `Follow`)."""
        self.draft_kind, self.value_so_far, self.draft_follow = kind, "", follow
        try:
            yield
        finally:
            self.draft_kind = None

    def _draft(self) -> list[int]:
        """Tokens likely to continue the value being written (`copy_draft`), or the expected
        tokens of a choice; if the source ends the value there, the draft goes on with the
        value's end (a string's closing quote) and the template's `follow`. The drafts run
        through the model with the pending tokens in one pass; each is kept only while it is the
        model's own constrained greedy choice (injected tokens: while they are what the template
        injects), so the output is the same as without drafting (up to float rounding of the
        batched pass)."""
        if self.choice_draft:
            return self.choice_draft[: self.dec.max_draft_tokens]
        if self.draft_kind is None or self.dec.max_draft_tokens < 1:
            return []
        draft = copy_draft_ids(self.backend.encode, self.value_so_far, self.draft_source, self.draft_kind)
        if draft is None:
            return []
        ids, ends = draft
        if ends and (self.draft_kind == "number" or self.vocab.quote_id is not None):
            ids += [self.vocab.quote_id] if self.draft_kind == "string" else []
            ids += self.follow_ids(self.draft_follow)
        return ids[: self.dec.max_draft_tokens]

    def follow_ids(self, follow: Follow) -> list[int]:
        return (self.backend.encode(follow.text) if follow.text else []) + list(follow.then)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over exactly the vocabulary tables' size (extra rows dropped, missing ones -inf)."""
        logits = logits[: self.vocab.size]
        if logits.shape[0] < self.vocab.size:
            logits = torch.cat([logits, logits.new_full((self.vocab.size - logits.shape[0],), -math.inf)])
        return logits

    def inject(self, text: str) -> None:
        if text:
            self.pending_text += text
            self.text_parts.append(text)
            self._publish()

    def _flush_text(self) -> None:
        if self.pending_text:
            for tid in self.backend.encode(self.pending_text):
                self._append(tid, False)
            self.pending_text = ""

    def _current_logits(self) -> torch.Tensor:
        self._flush_text()
        if self.feed:
            draft = self._draft()
            start = time.perf_counter()
            if draft:
                out = self.backend.forward(ids=self.feed + draft, cache=self.cache, logits_to_keep=len(draft) + 1)
                rows = out.tail_logits
                self.ahead = [(tid, self._fit(rows[i + 1])) for i, tid in enumerate(draft)]
                self.drafted += len(draft)
                self.logits = self._fit(rows[0])
            else:
                out = self.backend.forward(ids=self.feed, cache=self.cache)
                self.logits = self._fit(out.logits)
            self.forward_seconds += time.perf_counter() - start
            self.forward_calls += 1
            self.cache = out.cache
            self.feed = []
        return self.logits

    def finish(self) -> None:
        self._flush_text()  # the last tokens are counted but not run through the model
        self._drop_ahead()
        self.feed = []
        self.holds = []  # the list is closed: everything is final
        self._publish()

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    # -- decisions -------------------------------------------------------------------------
    def _teacher_pick(self, allowed: Any, target: str) -> int:
        """A token for the start of `target`: its natural first token if allowed, else the
        longest allowed token that is a prefix of it."""
        ok = (lambda t: bool(allowed[t])) if isinstance(allowed, torch.Tensor) else (lambda t, s=set(allowed): t in s)
        strings = self.vocab.strings
        first = self.backend.encode(target)[:1]
        if first and first[0] < self.vocab.size and strings[first[0]] and target.startswith(strings[first[0]]) and ok(first[0]):
            return first[0]
        for k in range(len(target), 0, -1):
            for t in self.vocab.by_string.get(target[:k], ()):
                if ok(t):
                    return t
        raise TemplateError(f"no allowed token can start {target!r}")

    def step(self, allowed: torch.Tensor | list[int], target: str | None = None) -> str:
        """Emit one token from `allowed` (a bool mask or a list of ids); returns its text."""
        self._flush_text()
        if self.teacher:
            assert target is not None
            tid = self._teacher_pick(allowed, target)
        else:
            logits = self._current_logits()
            if isinstance(allowed, torch.Tensor):
                masked = logits.masked_fill(~allowed, -math.inf)
                tid = int(torch.argmax(masked))
                if not allowed[tid]:  # every allowed logit is -inf (or NaN): take the first allowed
                    tid = int(torch.nonzero(allowed)[0])
            else:
                if not allowed:
                    raise RuntimeError("no allowed token")
                masked = torch.nan_to_num(logits[torch.tensor(allowed)], nan=-math.inf)
                tid = allowed[int(torch.argmax(masked))]
            # The model's own confidence: the chosen token's probability among the allowed ones
            # (the lowest over the output is what a router reads; hyfunc.routing.features).
            best = float(masked.max())
            if math.isfinite(best):
                self.min_probability = min(self.min_probability, math.exp(best - float(torch.logsumexp(masked, 0))))
                if self.min_probability < self.give_up_below:
                    raise GaveUp(self.min_probability)
        s = self.vocab.strings[tid]
        assert s is not None
        self._append(tid, True)
        self.text_parts.append(s)
        self._publish()
        return s

    def peek(self, masks: Sequence[torch.Tensor], gold: int | None = None) -> int:
        """Which token set holds the best logit; nothing is emitted. The token after the decision
        is marked in the target mask (the model's logits there decided it)."""
        if self.teacher:
            assert gold is not None
            self._flush_text()
            choice = gold
        else:
            logits = self._current_logits()
            best = [
                float(logits.masked_fill(~m, -math.inf).max()) if bool(m.any()) else -math.inf for m in masks
            ]
            best = [-math.inf if math.isnan(b) else b for b in best]
            choice = max(range(len(masks)), key=lambda i: (best[i], -i))
            if best[choice] == -math.inf:
                choice = next((i for i, m in enumerate(masks) if bool(m.any())), 0)
        self.decision_pending = True
        return choice

    def choice_path(self, options: Sequence[str], text: str, guess: int, after: Follow) -> list[int]:
        """The tokens the decoder feeds if the model picks option `guess` from here (the text
        chosen so far being `text`): the natural next token of its rest while other options
        remain, then its rest with `after`'s text as one flushed piece, then `after`'s tokens."""
        ids: list[int] = []
        while True:
            rest = options[guess][len(text):]
            live = [o for o in options if o.startswith(text)]
            if len(live) == 1:
                return ids + self.follow_ids(after.after(rest))
            if text in live:  # a peek (stop here or go on) comes next: the draft ends
                return ids
            first = self.backend.encode(rest)[:1]
            piece = self.vocab.strings[first[0]] if first and first[0] < self.vocab.size else None
            if not piece or not rest.startswith(piece):
                return ids
            ids.append(first[0])
            text += piece

    def choose(
        self,
        options: Sequence[str],
        gold: int | None = None,
        guesses: Sequence[int] = (),
        after: Sequence[Follow] = (),
    ) -> int:
        """Pick one of `options` (distinct, non-empty strings), emitting it; returns its index.
        `guesses`: the options the model will likely pick, most likely first, with `after` what
        the decoder feeds after each option: a pass that decides runs the first guess still
        possible, with its `after`, as a draft."""
        if len(set(options)) != len(options) or not all(options):
            raise ValueError(f"options must be distinct and non-empty: {options!r}")
        if self.teacher and gold is None:
            raise TemplateError("teacher mode needs the gold option")
        text = ""
        live = list(range(len(options)))
        while True:
            live = [i for i in live if options[i].startswith(text)]
            if len(live) == 1:
                self.inject(options[live[0]][len(text):])
                return live[0]
            complete = [i for i in live if options[i] == text]
            suffixes = [options[i][len(text):] for i in live if options[i] != text]
            cand = self.vocab.prefix_ids(suffixes)
            if complete:
                target_done = self.teacher and options[gold] == text
                stop = self.peek([self.vocab.mask_of(cand), self.vocab.terminators], 1 if target_done else 0)
                if stop == 1 or not cand:
                    return complete[0]
                self.decision_pending = False  # continuing: the next token is generated anyway
            if not cand:
                # No token spells the next characters (cannot happen with byte-level vocabularies):
                # fall back to the first live option.
                self.inject(options[live[0]][len(text):])
                return live[0]
            target = options[gold][len(text):] if self.teacher else None
            guess = next((g for g in guesses if options[g].startswith(text)), None) if not self.teacher else None
            if guess is not None:
                self.choice_draft = self.choice_path(options, text, guess, after[guess] if after else DECISION)
            try:
                text += self.step(cand, target)
            finally:
                self.choice_draft = []

