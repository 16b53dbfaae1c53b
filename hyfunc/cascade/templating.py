"""Dynamic templating: the small model writes only what it must choose; the rest is injected.

Output format (JSON, because tool names may contain spaces and dots)::

    [{"name": "<tool name>", "arguments": {"<key>": <value>, ...}}, {...}]

It is exactly ``json.dumps(calls, ensure_ascii=False)`` with the default separators (", ", ": "),
arguments ordered as the decoder writes them: required keys in schema (``properties``) order,
then the chosen optional keys, also in schema order. `render_target` renders gold calls so.

The skeleton comes from the candidate tools' *schemas* only. The model (greedy, its logits
restricted to what is allowed at that point) chooses:

- whether to call anything (``[]`` is an option unless the caller requires a call), which offered tool (a trie over the
  JSON-encoded names), how many calls (after each call ``, `` for another or ``]``; capped; a call repeated word for
  word is a greedy loop: it is taken back and the list closed, unless ``stop_on_repeat=False``; the same for an
  array item (string, object or array) that repeats an earlier one);
- which optional parameters to fill (after the required keys are injected, a choice among the
  remaining optional keys, in schema order, or ``}``);
- the values, under type constraints: string (free tokens that are valid JSON string content,
  ending with a token that ends exactly with the closing quote; capped), integer and number (the
  JSON number grammar as a character automaton), boolean/enum/null (tries over JSON encodings),
  arrays (items recursively, ``, ``/``]`` chosen after each item; capped), objects with
  properties (like the arguments), free objects and ``any`` (a small depth-limited JSON grammar).

Boilerplate (``[{"name": "``, the rest of a name once its prefix is unique, ``", "arguments": {``,
``"key": ``, punctuation) is never sampled: it is buffered as text and run through the model in
one forward pass together with the last generated token, when the next decision needs logits.

Copy drafting: string and number values are mostly spans of the request, so inside one the
decoder looks the value written so far up in `draft_source` and runs the tokens that follow it there
through the model together with the pending tokens, in one pass (on a CPU a pass over a few
tokens costs about as much as over one). A drafted token is kept only if it is the constrained
argmax at its position, exactly as if it had been stepped; the first mismatch is replaced by the
model's choice and the rest is cropped from the cache. Where the source marks the value's end (a
quote character, punctuation before a space, its own end), the draft runs on through the closing
quote and what the decoder feeds next if its guesses hold (`_Follow`): the text the template
injects (``, "next_key": "``, ``}}``) and guessed choices: no more optional keys, another call
while an offered tool is not called yet, that tool (the first not called in the order the request
mentions them, `_mention_order`) with its name and first key. Choices are drafted from the same
guesses when their own pass runs. When the guesses are right, one pass writes the end of a value
and everything up to the next value's first token; when not, nothing but speed is lost.

Three kinds of decision, all by the model's logits:

- *step*: argmax over an allowed token set; the token is emitted and fed ("generated").
- *choice among strings* (`_choose`): steps restricted to tokens that keep the text a prefix of
  some option; once a single option is left its remainder is injected. When the text equals an
  option that others extend (integer enum ``1`` vs ``10``) stopping is a *peek*.
- *peek*: compare the best logit of several token sets without emitting any of them, e.g.
  "continue the number" (digit tokens) against "stop" (tokens starting with ``,``/``}``/``]``),
  or, where a value may start in different ways, "close the array" (``]...``) against "another
  item". The winner's set decides; what follows is then injected or stepped. A peek costs no
  forward pass and emits nothing, so the logits of the next position are not needed.

Training targets (`target_token_mask`) run the very same walker in *teacher* mode: decisions
follow the gold calls, tokens follow the natural tokenization of each segment, and no model is
run, so the target ids are exactly the ids the decoder feeds when its logits agree with the
gold (a teacher-forcing test checks this). Its mask marks the tokens whose logits drive the
decoder: generated tokens, plus the token right after each peek decision (e.g. the ``,`` after
a number, the ``"`` opening a string where ``null`` was possible) so the model learns to stop.

Known limits: BPE tokens that are partial UTF-8 sequences (byte fallback pieces) are never
allowed, so a character without a whole-character token cannot appear in a generated string;
an escape sequence must lie within one token; caps (calls, string tokens, array items, number
length, ``any`` depth) truncate; the decoder extends the caller's KV cache in place (pass a
`Backend.fork` to keep it) and does not feed the final tokens of its output.
"""
from __future__ import annotations

import json
import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Param, Tool
from hyfunc.formats.validate import TYPE_CHECKS
from hyfunc.models.backend import StepOutput

__all__ = ["TemplateDecoder", "TemplatedOutput", "render_target", "target_token_mask", "TemplateError"]


class TemplateError(ValueError):
    """Gold calls that the template cannot produce (unknown tool, invalid argument, ...)."""


@dataclass
class TemplatedOutput:
    calls: list[Call]
    text: str  # the full JSON emitted
    token_ids: list[int]  # every emitted token, generated and injected, in order
    generated_tokens: int  # tokens chosen by the model's logits (argmax over an allowed set)
    injected_tokens: int  # tokens forced by the template
    forward_calls: int  # model forward passes run by the decoder
    seconds: float  # wall time of `decode`
    forward_seconds: float = 0.0  # of which in model forward passes
    drafted_tokens: int = 0  # value tokens proposed by copying from `draft_source`
    accepted_draft_tokens: int = 0  # of which the model's own greedy choice (no pass of their own)


_MISSING = object()
_DRAFT_MATCH_CHARS = 32  # longest end piece of a value looked up in the draft source
_DRAFT_LOOKAHEAD_CHARS = 64  # source text after the match that drafts are tokenized from
_QUOTES = set("\"'`\u2018\u2019\u201c\u201d")
_CLAUSE_ENDS = set(",.;:!?")

# ---------------------------------------------------------------------------------------------
# Vocabulary tables, computed once per (tokenizer, size)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2 / Qwen byte-level BPE: every byte is spelled as one printable unicode character.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _token_strings(tokenizer: Any, size: int) -> list[str | None]:
    """The text of every token id as it appears inside a longer text; None when it is a special
    token, a partial UTF-8 sequence, empty, or out of the tokenizer's range."""
    n = min(size, len(tokenizer))
    special: set[int] = set(getattr(tokenizer, "all_special_ids", []) or [])
    special.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    byte_level = all(p is None or i in special or all(ch in byte_of for ch in p) for i, p in enumerate(pieces))
    out: list[str | None] = [None] * size
    for i, p in enumerate(pieces):
        if p is None or i in special:
            continue
        if byte_level:
            try:
                s = bytes(byte_of[ch] for ch in p).decode("utf-8")
            except UnicodeDecodeError:
                continue
        elif p.startswith("<0x") and p.endswith(">") and len(p) == 6:  # sentencepiece byte piece
            b = int(p[3:5], 16)
            if b >= 0x80:
                continue
            s = chr(b)
        else:
            s = p.replace("\u2581", " ")
            if "\ufffd" in s:
                continue
        if s:
            out[i] = s
    return out


_NUM_CHARS = set("0123456789-+.eE")
_DIGITS = set("0123456789")
# JSON number automaton. Accepting states: zero, int, frac, exp, exp2.
_ACCEPT = {"zero", "int", "frac", "exp", "exp2"}


def _num_next(state: str, ch: str, integer: bool) -> str | None:
    if state == "start":
        return "minus" if ch == "-" else "zero" if ch == "0" else "int" if ch in _DIGITS else None
    if state == "minus":
        return "zero" if ch == "0" else "int" if ch in _DIGITS else None
    if state in ("zero", "int"):
        if state == "int" and ch in _DIGITS:
            return "int"
        if integer:
            return None
        return "dot" if ch == "." else "e" if ch in "eE" else None
    if state in ("dot", "frac"):
        if ch in _DIGITS:
            return "frac"
        return "e" if state == "frac" and ch in "eE" else None
    if state == "e":
        return "esign" if ch in "+-" else "exp" if ch in _DIGITS else None
    if state == "esign":
        return "exp" if ch in _DIGITS else None
    if state == "exp":  # at most two exponent digits: a decoded number never overflows to inf
        return "exp2" if ch in _DIGITS else None
    return None


class _Vocab:
    def __init__(self, tokenizer: Any, size: int):
        self.size = size
        self.strings = _token_strings(tokenizer, size)
        self.by_string: dict[str, list[int]] = {}
        # String content masks per state (0: normal, 1: right after an unpaired backslash):
        # safe (ends in state 0), open (ends in state 1), closing (ends with the closing quote).
        z = lambda: torch.zeros(size, dtype=torch.bool)  # noqa: E731
        safe, opened, closing = [z(), z()], [z(), z()], [z(), z()]
        starts: dict[str, torch.Tensor] = {c: torch.zeros(size, dtype=torch.bool) for c in '"[]{},'}
        self.num_tokens: list[tuple[int, str]] = []
        for i, s in enumerate(self.strings):
            if s is None:
                continue
            self.by_string.setdefault(s, []).append(i)
            for state in (0, 1):
                kind = _string_piece_kind(s, state)
                if kind is not None:
                    (safe, opened, closing)[kind][state][i] = True
            if s[0] in starts:
                starts[s[0]][i] = True
            if all(ch in _NUM_CHARS for ch in s):
                self.num_tokens.append((i, s))
        self.str_safe, self.str_open, self.str_closing = safe, opened, closing
        self.str_any = [safe[st] | opened[st] | closing[st] for st in (0, 1)]
        self.starts = starts
        self.terminators = starts[","] | starts["}"] | starts["]"]
        self.quote_id: int | None = min(self.by_string.get('"', [None]))  # a string's plain closing token
        self._num: dict[tuple[bool, str], tuple[torch.Tensor, dict[int, str]]] = {}

    def number_step(self, integer: bool, state: str) -> tuple[torch.Tensor, dict[int, str]]:
        """Tokens that keep the number grammar alive from `state`, with the state each leads to."""
        key = (integer, state)
        if key not in self._num:
            mask = torch.zeros(self.size, dtype=torch.bool)
            nxt: dict[int, str] = {}
            for i, s in self.num_tokens:
                st: str | None = state
                for ch in s:
                    st = _num_next(st, ch, integer)
                    if st is None:
                        break
                if st is not None:
                    mask[i] = True
                    nxt[i] = st
            self._num[key] = (mask, nxt)
        return self._num[key]

    def prefix_ids(self, suffixes: Sequence[str]) -> list[int]:
        """Token ids whose text is a non-empty prefix of one of `suffixes` (sorted, unique)."""
        ids: set[int] = set()
        get = self.by_string.get
        for r in suffixes:
            for k in range(1, len(r) + 1):
                found = get(r[:k])
                if found:
                    ids.update(found)
        return sorted(ids)

    def mask_of(self, ids: Sequence[int]) -> torch.Tensor:
        m = torch.zeros(self.size, dtype=torch.bool)
        if ids:
            m[torch.tensor(list(ids))] = True
        return m


_ESCAPES = set('"\\/bfnrt')
_HEX = set("0123456789abcdefABCDEF")


def _string_piece_kind(s: str, state: int) -> int | None:
    """How token text `s` continues JSON string content in `state` (1: after an unpaired
    backslash): 0 valid content, 1 valid content ending inside an escape (a trailing unpaired
    backslash), 2 valid content then the closing quote (at the very end), None invalid."""
    if state == 1:
        if s[:1] in _ESCAPES:
            s = s[1:]
        elif s[:1] == "u" and len(s) >= 5 and all(c in _HEX for c in s[1:5]):
            s = s[5:]
        else:
            return None
        if not s:
            return 0
    if _string_content_ok(s):
        return 0
    if s.endswith("\\") and _string_content_ok(s + "\\"):
        return 1
    if s.endswith('"') and _string_content_ok(s[:-1]):
        return 2
    return None


def _string_content_ok(s: str) -> bool:
    """Is `s` a complete piece of JSON string content (no quote/backslash/control unescaped)?"""
    if '"' not in s and "\\" not in s and all(ord(ch) >= 0x20 for ch in s):
        return True
    try:
        json.loads('"' + s + '"')
    except ValueError:
        return False
    return True


_VOCABS: dict[tuple[int, int], tuple[Any, _Vocab]] = {}


@dataclass(frozen=True)
class _Follow:
    """What the decoder feeds after a value or choice when the drafts' guesses hold: `text` the
    template injects (flushed as one piece), then `then`, the tokens of guessed decisions beyond
    it (the next call's opening, name and first key). Empty: a decision comes right after."""

    text: str = ""
    then: tuple[int, ...] = ()

    def after(self, prefix: str) -> _Follow:
        return _Follow(prefix + self.text, self.then)


_DECISION = _Follow()


def _name_words(name: str) -> list[str]:
    """"getMobileColorScheme" -> ["get", "mobile", "color", "scheme"] (also snake_case, dots)."""
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]


def _mention_order(tools: Sequence[Tool], source: str) -> list[int]:
    """Tool indices in the order the request likely calls them: by the first mention in
    `source` of a word of the tool's name that other tools' names lack ("color" of
    getMobileColorScheme, not "get" or "mobile"), unmentioned tools last, ties by rank."""
    words = [set(w for w in _name_words(t.name) if len(w) > 2) for t in tools]
    text = source.lower()

    def first_mention(i: int) -> float:
        own = {w for w in words[i] if not any(w in other for j, other in enumerate(words) if j != i)} or words[i]
        found = [m.start() for w in own if (m := re.search(r"\b" + re.escape(w) + r"(?:s|es|ed|ing)?\b", text))]
        return min(found, default=math.inf)

    return sorted(range(len(tools)), key=lambda i: (first_mention(i), i))


def _find(source: str, piece: str, whole: bool) -> int:
    """Where `piece` occurs in `source` (-1: nowhere); a `whole` value so far is looked for at
    a word's start first ("3" of "ID 31" rather than of "size 73")."""
    if whole and piece[:1].isalnum():
        at = source.find(piece)
        while at > 0 and source[at - 1].isalnum():
            at = source.find(piece, at + 1)
        if at >= 0:
            return at
    return source.find(piece)


def _value_end(text: str, i: int, clauses: bool = True) -> bool:
    """Whether a value copied from `text` likely ends before position `i`: at a quote character,
    a control character, or (`clauses`) clause punctuation followed by a space or the end ("in
    Los Angeles.", "iOS, and")."""
    ch = text[i]
    if ch in _QUOTES or ord(ch) < 0x20:
        return True
    return clauses and ch in _CLAUSE_ENDS and (i + 1 == len(text) or text[i + 1].isspace())


def _vocab_for(tokenizer: Any, size: int) -> _Vocab:
    key = (id(tokenizer), size)
    hit = _VOCABS.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    vocab = _Vocab(tokenizer, size)
    if len(_VOCABS) >= 4:
        _VOCABS.pop(next(iter(_VOCABS)))
    _VOCABS[key] = (tokenizer, vocab)  # keeps the tokenizer alive so the id is not reused
    return vocab


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# The walker: one code path for decoding (model mode) and target building (teacher mode)


class _Session:
    def __init__(
        self, dec: TemplateDecoder, vocab: _Vocab, step: StepOutput | None, teacher: bool, draft_source: str = ""
    ):
        self.dec = dec
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
        self.draft_follow = _DECISION
        self.choice_draft: list[int] = []  # the expected tokens of a choice being made (see `choose`)
        self.ahead: list[tuple[int, torch.Tensor]] = []
        self.drafted = 0
        self.accepted = 0

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

    def rewind(self, mark: tuple) -> None:
        """Take back everything emitted since `mark`, from the output and from the KV cache."""
        n_ids, n_parts, self.pending_text, feed, self.logits, cached, self.decision_pending = mark
        self._drop_ahead()
        del self.ids[n_ids:], self.generated[n_ids:], self.decision[n_ids:], self.text_parts[n_parts:]
        self.feed = list(feed)
        if (extra := self.cache.get_seq_length() - cached) > 0:
            self.cache.crop(-extra)

    def _drop_ahead(self) -> None:
        """Remove the drafted tokens that were not emitted from the cache."""
        if self.ahead:
            self.cache.crop(-len(self.ahead))
            self.ahead = []

    @contextmanager
    def drafting(self, kind: str, follow: _Follow = _DECISION) -> Iterator[None]:
        """While a string's content or a number is written, drafts may be copied for it;
        `follow`: what the decoder feeds after the value (see `_Follow`)."""
        self.draft_kind, self.value_so_far, self.draft_follow = kind, "", follow
        try:
            yield
        finally:
            self.draft_kind = None

    def _draft(self) -> list[int]:
        """Tokens likely to continue the value being written, copied from `draft_source`.

        Argument values are mostly spans of the request: find the longest recent piece of the
        value (at least 3 characters, or all of it) in the source and propose what follows it
        there, up to the first character the value cannot hold. If the source ends the value
        there (see `_value_end`), the draft goes on with the value's end (a string's closing
        quote) and the template's `follow`. The drafts run through the model with the
        pending tokens in one pass; each is kept only while it is the model's own constrained
        greedy choice (injected tokens: while they are what the template injects), so the output
        is the same as without drafting (up to float rounding of the batched pass).
        """
        if self.choice_draft:
            return self.choice_draft[: self.dec.max_draft_tokens]
        text, source = self.value_so_far, self.draft_source
        if not text or not source or self.draft_kind is None or self.dec.max_draft_tokens < 1:
            return []
        at, n = -1, min(len(text), _DRAFT_MATCH_CHARS)
        while n >= min(len(text), 3) and (at := _find(source, text[-n:], whole=n == len(text))) < 0:
            n -= 1
        if at < 0:
            return []
        rest = source[at + n : at + n + _DRAFT_LOOKAHEAD_CHARS]
        source_ends = at + n + len(rest) == len(source)  # the source's end ends a value too
        if self.draft_kind == "number":
            cut = next((i for i, ch in enumerate(rest) if ch not in _NUM_CHARS), len(rest) if source_ends else None)
            ends = cut is not None
            if ends:  # "of 73." ends the number before its period
                cut = len(rest[:cut].rstrip(".eE+-"))
        else:  # string content: up to a character that would need escaping, or the value's end
            # Past punctuation the value already holds, punctuation no longer marks its end.
            clauses = not any(ch in _CLAUSE_ENDS for ch in text)
            stops = (i for i, ch in enumerate(rest) if ch in '"\\' or _value_end(rest, i, clauses))
            cut = next(stops, len(rest) if source_ends else None)
            ends = cut is not None and (cut == len(rest) or _value_end(rest, cut, clauses))
        ids = self.backend.encode(rest[:cut])
        if cut is None:
            ids = ids[:-1]  # the last token may be cut short
        elif ends and (self.draft_kind == "number" or self.vocab.quote_id is not None):
            ids += [self.vocab.quote_id] if self.draft_kind == "string" else []
            ids += self._follow_ids(self.draft_follow)
        return ids[: self.dec.max_draft_tokens]

    def _follow_ids(self, follow: _Follow) -> list[int]:
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
                tid = int(torch.argmax(logits.masked_fill(~allowed, -math.inf)))
                if not allowed[tid]:  # every allowed logit is -inf (or NaN): take the first allowed
                    tid = int(torch.nonzero(allowed)[0])
            else:
                if not allowed:
                    raise RuntimeError("no allowed token")
                sub = logits[torch.tensor(allowed)]
                sub = torch.nan_to_num(sub, nan=-math.inf)
                tid = allowed[int(torch.argmax(sub))]
        s = self.vocab.strings[tid]
        assert s is not None
        self._append(tid, True)
        self.text_parts.append(s)
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

    def _choice_path(self, options: Sequence[str], text: str, guess: int, after: _Follow) -> list[int]:
        """The tokens the decoder feeds if the model picks option `guess` from here (the text
        chosen so far being `text`): the natural next token of its rest while other options
        remain, then its rest with `after`'s text as one flushed piece, then `after`'s tokens."""
        ids: list[int] = []
        while True:
            rest = options[guess][len(text):]
            live = [o for o in options if o.startswith(text)]
            if len(live) == 1:
                return ids + self._follow_ids(after.after(rest))
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
        after: Sequence[_Follow] = (),
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
                self.choice_draft = self._choice_path(options, text, guess, after[guess] if after else _DECISION)
            try:
                text += self.step(cand, target)
            finally:
                self.choice_draft = []


class _Walker:
    """Walks the template; `gold` arguments are only used (and required) in teacher mode."""

    def __init__(self, dec: TemplateDecoder, s: _Session, require_call: bool = False):
        self.dec = dec
        self.s = s
        self.require_call = require_call
        self.v = s.vocab
        self.teacher = s.teacher

    # -- top level -------------------------------------------------------------------------
    def calls(self, tools: Sequence[Tool], gold: Sequence[Call] | None) -> None:
        s = self.s
        s.inject("[")
        by_name = {t.name: t for t in tools}
        if self.teacher:
            for c in gold:
                if c.name not in by_name:
                    raise TemplateError(f"gold call names {c.name!r}, not among the offered tools")
        if not tools:
            s.inject("]")
            return
        names = [_dumps(t.name)[1:] for t in tools]  # name content + closing quote
        opener = '{"name": "'
        separator = [", " + opener, "]"]
        # Guesses drafted in model mode: the tools in the order the request likely calls them
        # (the first not called yet comes next, else the last again), and what the decoder
        # feeds after each name up to the first value or key choice.
        order = _mention_order(tools, s.draft_source) if not self.teacher else list(range(len(tools)))
        heads = [self._object_head(t.parameters, t.required, _Follow("}")).after(', "arguments": ') for t in tools]
        called: list[int] = []

        def guesses() -> list[int]:
            return [j for j in order if j not in called] + called[::-1]

        def next_call() -> _Follow:
            """What follows the opener of the next call, as guessed."""
            if len(tools) == 1:  # the name is injected with the opener's rest
                return heads[0].after(names[0])
            g = guesses()[0]
            return _Follow(then=tuple(s._choice_path(names, "", g, heads[g]))) if not self.teacher else _DECISION

        n = 0
        if self.require_call and not self.teacher:
            s.inject(opener)
        elif s.choose([opener, "]"], (0 if gold else 1) if self.teacher else None, (0, 1), [next_call(), _DECISION]):
            return
        written: list[str] = []  # the calls so far, as JSON text
        before_separator = None
        while True:
            start = len(s.text) - len(opener)
            g = gold[n] if self.teacher else None
            i = s.choose(names, [t.name for t in tools].index(g.name) if g is not None else None, guesses(), heads)
            called.append(i)
            tool = tools[i]
            s.inject(', "arguments": ')
            more = len(set(called)) < len(tools)  # the guess: another call while a tool is left
            upcoming = next_call()  # the same guess wherever the separator gets drafted
            then = []
            if not self.teacher:
                then = s._choice_path(separator, "", 0 if more else 1, upcoming if more else _DECISION)
            arguments = g.arguments if g is not None else _MISSING
            self.object_props(tool.parameters, tool.required, arguments, tool.name, _Follow("}", tuple(then)))
            s.inject("}")
            if not self.teacher and self.dec.stop_on_repeat and self._closed_on_repeat(s.text[start:], written, before_separator):
                return
            n += 1
            if n >= self.dec.max_calls and not self.teacher:
                s.inject("]")
                return
            before_separator = s.mark() if not self.teacher else None
            gold_choice = (0 if n < len(gold) else 1) if self.teacher else None
            if s.choose(separator, gold_choice, (0, 1) if more else (1, 0), [upcoming, _DECISION]) == 1:
                return

    def _closed_on_repeat(self, text: str, written: list[str], before_separator: tuple | None) -> bool:
        """A list element (a call, an array item) word for word an earlier one: greedy decoding has
        entered a loop (it would go on to the cap). The repeat is taken back to `before_separator`
        and the list closed (True); otherwise `text` joins `written`."""
        if text in written:
            self.s.rewind(before_separator)
            self.s.inject("]")
            return True
        written.append(text)
        return False

    # -- values ----------------------------------------------------------------------------
    def object_props(
        self, props: dict[str, Param], required: Sequence[str], gold: Any, where: str, follow: _Follow = _DECISION
    ) -> None:
        """`follow`: what the decoder feeds after this object (see `value`)."""
        s = self.s
        if self.teacher:
            if not isinstance(gold, dict):
                raise TemplateError(f"{where}: expected an object, got {gold!r}")
            unknown = [k for k in gold if k not in props]
            if unknown:
                raise TemplateError(f"{where}: unknown argument(s) {unknown}")
            missing = [k for k in required if k not in gold]
            if missing:
                raise TemplateError(f"{where}: missing required argument(s) {missing}")
        req = set(required)
        s.inject("{")
        keys = [k for k in props if k in req]
        remaining = [k for k in props if k not in req]

        def key_options(first: bool) -> list[str]:
            return [("" if first else ", ") + _dumps(k) + ": " for k in remaining] + ["}"]

        def after_last() -> _Follow:
            """What follows the value before the optional keys `remaining`: the object's end,
            directly or (guessed) chosen over them."""
            if not remaining:
                return follow.after("}")
            if self.teacher:
                return _DECISION
            return _Follow(then=tuple(s._choice_path(key_options(False), "", len(remaining), follow)))

        for i, k in enumerate(keys):
            s.inject(("" if i == 0 else ", ") + _dumps(k) + ": ")
            if i + 1 < len(keys):
                after = _Follow(", " + _dumps(keys[i + 1]) + ": " + self._opening(props[keys[i + 1]]))
            else:
                after = after_last()
            self.value(props[k], gold[k] if self.teacher else _MISSING, f"{where}.{k}", follow=after)
        first = not keys
        while remaining:
            opts = key_options(first)
            g = None
            if self.teacher:
                g = next((j for j, k in enumerate(remaining) if k in gold), len(remaining))
            # Guessed: no more optional keys.
            j = s.choose(opts, g, [len(remaining), *range(len(remaining))], [_DECISION] * len(remaining) + [follow])
            if j == len(remaining):
                return
            k = remaining[j]
            remaining = remaining[j + 1:]
            self.value(props[k], gold[k] if self.teacher else _MISSING, f"{where}.{k}", follow=after_last())
            first = False
        s.inject("}")

    def _choice_options(self, p: Param) -> list[tuple[str, Any]] | None:
        """(JSON text, value) options for enum/boolean params, None for other params."""
        nullable = p.has_default and p.default is None
        if p.enum is not None:
            check = TYPE_CHECKS.get(p.type, lambda v: True)
            members = [v for v in p.enum if check(v)] or list(p.enum)
            opts = []
            for v in members + ([None] if nullable and None not in members else []):
                t = _dumps(v)
                if all(t != o for o, _ in opts):
                    opts.append((t, v))
            return opts
        if p.type == "boolean":
            return [("true", True), ("false", False)] + ([("null", None)] if nullable else [])
        return None

    def start_mask(self, p: Param | None, depth: int = 0) -> torch.Tensor:
        """Tokens that can start a value of schema `p` (None: any JSON value)."""
        v = self.v
        if p is None or p.type == "any" or (p.type == "object" and not p.properties):
            if p is not None and p.type == "object":
                return v.starts["{"]
            m = v.starts['"'] | v.number_step(False, "start")[0] | v.mask_of(v.prefix_ids(["true", "false", "null"]))
            if depth < self.dec.max_any_depth:
                m = m | v.starts["["] | v.starts["{"]
            return m
        opts = self._choice_options(p)
        if opts is not None:
            return v.mask_of(v.prefix_ids([o for o, _ in opts]))
        m = {
            "string": v.starts['"'],
            "integer": v.number_step(True, "start")[0],
            "number": v.number_step(False, "start")[0],
            "array": v.starts["["],
            "object": v.starts["{"],
        }[p.type]
        if p.has_default and p.default is None:
            m = m | v.mask_of(v.prefix_ids(["null"]))
        return m

    def _object_head(self, props: dict[str, Param], required: Sequence[str], follow: _Follow) -> _Follow:
        """What `object_props` feeds first: up to the first value or key choice, or the whole
        empty object and `follow`."""
        first = next((k for k in props if k in set(required)), None)
        if first is not None:
            return _Follow("{" + _dumps(first) + ": " + self._opening(props[first]))
        return _Follow("{") if props else follow.after("{}")

    @staticmethod
    def _opening(p: Param) -> str:
        """The text a value of `p` surely starts with, injected before any decision."""
        plain_string = p.type == "string" and p.enum is None and not (p.has_default and p.default is None)
        return '"' if plain_string else ""

    def value(self, p: Param | None, gold: Any, where: str, depth: int = 0, follow: _Follow = _DECISION) -> None:
        """`follow`: what the decoder feeds right after this value if the guesses hold (see
        `_Follow`); string and number drafts run into it."""
        s = self.s
        if p is None or p.type == "any" or (p.type == "object" and not p.properties):
            if self.teacher and p is not None and p.type == "object" and not isinstance(gold, dict):
                if not (gold is None and p.has_default and p.default is None):
                    raise TemplateError(f"{where}: expected an object, got {gold!r}")
            if p is not None and p.type == "object" and not (p.has_default and p.default is None):
                self.free_object(gold, where, depth)
            else:
                self.any_value(gold, where, depth, only_object=p is not None and p.type == "object")
            return
        opts = self._choice_options(p)
        if opts is not None:
            g = None
            if self.teacher:
                g = next((i for i, (_, val) in enumerate(opts) if _same(val, gold)), None)
                if g is None:
                    raise TemplateError(f"{where}: {gold!r} is not among {[o for o, _ in opts]}")
            s.choose([o for o, _ in opts], g)
            return
        if p.has_default and p.default is None:
            null_mask = self.v.mask_of(self.v.prefix_ids(["null"]))
            body = {
                "string": self.v.starts['"'],
                "integer": self.v.number_step(True, "start")[0],
                "number": self.v.number_step(False, "start")[0],
                "array": self.v.starts["["],
                "object": self.v.starts["{"],
            }[p.type]
            if s.peek([null_mask, body], (0 if gold is None else 1) if self.teacher else None) == 0:
                s.choose(["null"], 0)
                return
        if self.teacher and not TYPE_CHECKS[p.type](gold):
            raise TemplateError(f"{where}: expected {p.type}, got {gold!r}")
        if p.type == "string":
            self.string(gold, follow)
        elif p.type in ("integer", "number"):
            self.number(p.type == "integer", gold, where, follow)
        elif p.type == "array":
            self.array(p.items, gold, where, depth)
        else:
            self.object_props(p.properties, p.required, gold, where, follow)

    def string(self, gold: Any, follow: _Follow = _DECISION) -> None:
        s, v = self.s, self.v
        s.inject('"')
        target = _dumps(gold)[1:] if self.teacher else None  # content + closing quote
        n, state = 0, 0
        with s.drafting("string", follow):
            while True:
                if self.teacher or n < self.dec.max_string_tokens:
                    allowed = v.str_any[state]
                else:  # over the cap: close now (after finishing an open escape)
                    allowed = v.str_closing[0] if state == 0 else v.str_safe[1]
                piece = s.step(allowed, target)
                tid = s.ids[-1]
                n += 1
                if self.teacher:
                    target = target[len(piece):]
                if v.str_closing[state][tid]:
                    return  # a closing token: content (maybe empty) then the quote
                s.value_so_far += piece
                state = 1 if v.str_open[state][tid] else 0

    def number(self, integer: bool, gold: Any, where: str, follow: _Follow = _DECISION) -> None:
        s, v = self.s, self.v
        target = None
        if self.teacher:
            if isinstance(gold, float) and not math.isfinite(gold):
                raise TemplateError(f"{where}: {gold!r} has no JSON spelling")
            target = _dumps(gold)
        state, length = "start", 0
        with s.drafting("number", follow):
            while True:
                mask, nxt = v.number_step(integer, state)
                if state in _ACCEPT:
                    if length >= self.dec.max_number_chars and not self.teacher:
                        return
                    if s.peek([mask, v.terminators], (1 if not target else 0) if self.teacher else None) == 1:
                        return
                    s.decision_pending = False  # continuing: the next token is generated
                piece = s.step(mask, target)
                tid = s.ids[-1]
                state = nxt[tid]
                length += len(piece)
                s.value_so_far += piece
                if self.teacher:
                    target = target[len(piece):]

    def array(self, items: Param | None, gold: Any, where: str, depth: int) -> None:
        s = self.s
        s.inject("[")
        start = self.start_mask(items, depth + 1)
        if s.peek([self.v.starts["]"], start], (0 if not gold else 1) if self.teacher else None) == 0:
            s.inject("]")
            return
        guard = not self.teacher and self.dec.stop_on_repeat
        written: list[str] = []  # the items so far that a loop would repeat: strings, objects, arrays
        before_separator = None
        n = 0
        while True:
            item_start = len(s.text)
            self.value(items, gold[n] if self.teacher else _MISSING, f"{where}[{n}]", depth + 1)
            item = s.text[item_start:]
            # Numbers and booleans may repeat on purpose ([1, 1, 2]); strings, objects and arrays not.
            if guard and item[:1] in '"{[' and self._closed_on_repeat(item, written, before_separator):
                return
            n += 1
            if n >= self.dec.max_array_items and not self.teacher:
                s.inject("]")
                return
            before_separator = s.mark() if guard else None
            if s.choose([", ", "]"], (0 if n < len(gold) else 1) if self.teacher else None) == 1:
                return

    def free_object(self, gold: Any, where: str, depth: int) -> None:
        s = self.s
        s.inject("{")
        keys = list(gold) if self.teacher else []
        if self.teacher and not all(isinstance(k, str) for k in keys):
            raise TemplateError(f"{where}: object keys must be strings")
        if s.peek([self.v.starts["}"], self.v.starts['"']], (0 if not keys else 1) if self.teacher else None) == 0:
            s.inject("}")
            return
        n = 0
        while True:
            key = keys[n] if self.teacher else _MISSING
            self.string(key)
            s.inject(": ")
            self.any_value(gold[key] if self.teacher else _MISSING, f"{where}.{key if self.teacher else '*'}", depth + 1)
            n += 1
            if n >= self.dec.max_array_items and not self.teacher:
                s.inject("}")
                return
            if s.choose([", ", "}"], (0 if n < len(keys) else 1) if self.teacher else None) == 1:
                return

    def any_value(self, gold: Any, where: str, depth: int, only_object: bool = False) -> None:
        s, v = self.s, self.v
        alts = [v.starts['"'], v.number_step(False, "start")[0], v.mask_of(v.prefix_ids(["true", "false", "null"]))]
        if depth < self.dec.max_any_depth:
            alts += [v.starts["["], v.starts["{"]]
        g = None
        if self.teacher:
            if isinstance(gold, str):
                g = 0
            elif isinstance(gold, bool) or gold is None:
                g = 2
            elif isinstance(gold, (int, float)):
                g = 1
            elif isinstance(gold, (list, tuple)):
                g = 3
            elif isinstance(gold, dict):
                g = 4
            if g is None or g >= len(alts):
                raise TemplateError(f"{where}: cannot write {gold!r} (too deep or not JSON)")
        if only_object:  # a nullable free object: null or an object
            alts = [v.mask_of(v.prefix_ids(["null"])), v.starts["{"]]
            g = (0 if gold is None else 1) if self.teacher else None
            if s.peek(alts, g) == 0:
                s.choose(["null"], 0)
            else:
                self.free_object(gold, where, depth)
            return
        k = s.peek(alts, g)
        if k == 0:
            self.string(gold)
        elif k == 1:
            self.number(False, gold, where)
        elif k == 2:
            opts = ["true", "false", "null"]
            s.choose(opts, opts.index(_dumps(gold)) if self.teacher else None)
        elif k == 3:
            self.array(None, gold, where, depth)
        else:
            self.free_object(gold, where, depth)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_dumps(a) == _dumps(b))


# ---------------------------------------------------------------------------------------------
# Public API


class TemplateDecoder:
    """Dynamic templating decoder over a `Backend` (the small model).

    `decode(step, tools)`: `step` is the `StepOutput` of the prompt's last position (its cache is
    extended in place; pass a fork to keep it), `tools` the candidate tools (may be empty: the
    output is then ``[]``). Greedy; the output always parses, names only offered tools and
    arguments, and passes `argument_errors`.
    """

    def __init__(
        self,
        backend: Any,
        max_calls: int = 8,
        max_string_tokens: int = 64,
        max_array_items: int = 16,
        max_number_chars: int = 24,
        max_any_depth: int = 2,
        max_draft_tokens: int = 24,
        stop_on_repeat: bool = True,
    ):
        if max_calls < 1:
            raise ValueError("max_calls must be >= 1")
        self.backend = backend
        self.max_calls = max_calls
        self.max_string_tokens = max_string_tokens
        self.max_array_items = max(1, max_array_items)
        self.max_number_chars = max_number_chars
        self.max_any_depth = max_any_depth
        self.max_draft_tokens = max_draft_tokens
        self.stop_on_repeat = stop_on_repeat
        self._vocab: _Vocab | None = None

    def vocab(self, size: int | None = None) -> _Vocab:
        """Per-tokenizer tables (token texts, string/number/punctuation masks), built once."""
        size = size or len(self.backend.tokenizer)
        if self._vocab is None or self._vocab.size != size:
            self._vocab = _vocab_for(self.backend.tokenizer, size)
        return self._vocab

    def decode(
        self, step: StepOutput, tools: Sequence[Tool], require_call: bool = False, draft_source: str = ""
    ) -> TemplatedOutput:
        """`require_call`: at least one call when `tools` is not empty (the caller has already
        decided that a tool fits, e.g. the retriever); otherwise ``[]`` is the model's choice.
        `draft_source`: text that string values are likely copied from (the request); drafts
        from it are verified by the model, so they change the speed, not the output."""
        start = time.perf_counter()
        vocab = self.vocab(int(step.logits.shape[-1]))
        session = _Session(self, vocab, step, teacher=False, draft_source=draft_source)
        _Walker(self, session, require_call).calls(list(tools), None)
        session.finish()
        text = session.text
        data = json.loads(text)
        calls = [Call(d["name"], d["arguments"]) for d in data]
        n_gen = sum(session.generated)
        return TemplatedOutput(
            calls=calls,
            text=text,
            token_ids=list(session.ids),
            generated_tokens=n_gen,
            injected_tokens=len(session.ids) - n_gen,
            forward_calls=session.forward_calls,
            seconds=time.perf_counter() - start,
            forward_seconds=session.forward_seconds,
            drafted_tokens=session.drafted,
            accepted_draft_tokens=session.accepted,
        )

    def target(self, calls: Sequence[Call], tools: Sequence[Tool]) -> tuple[list[int], list[bool], list[bool]]:
        """Teacher mode: (ids, generated, trained) for gold `calls`; see `target_token_mask`."""
        session = _Session(self, self.vocab(), None, teacher=True)
        _Walker(self, session).calls(list(tools), list(calls))
        session.finish()
        return list(session.ids), list(session.generated), list(session.decision)


def _ordered(value: Any, p: Param | None) -> Any:
    if p is not None and p.type == "object" and p.properties and isinstance(value, dict):
        return _ordered_args(value, p.properties, p.required)
    if p is not None and p.type == "array" and isinstance(value, (list, tuple)):
        return [_ordered(x, p.items) for x in value]
    if isinstance(value, tuple):
        return list(value)
    return value


def _ordered_args(args: dict[str, Any], props: dict[str, Param], required: Sequence[str]) -> dict[str, Any]:
    req = set(required)
    keys = [k for k in props if k in req and k in args] + [k for k in props if k not in req and k in args]
    keys += [k for k in args if k not in props]  # invalid extras kept last (target building rejects them)
    return {k: _ordered(args[k], props.get(k)) for k in keys}


def render_target(calls: Sequence[Call], tools: Sequence[Tool]) -> str:
    """Gold calls in exactly the text the decoder emits: ``json.dumps`` (", " and ": " separators,
    non-ASCII kept) of ``[{"name", "arguments"}]``, arguments (and nested objects with
    properties) ordered required keys first in schema order, then optional keys in schema order.
    ``[]`` for no calls. Calls naming tools outside `tools` keep their argument order."""
    by_name = {t.name: t for t in tools}
    out = []
    for c in calls:
        tool = by_name.get(c.name)
        args = _ordered_args(c.arguments, tool.parameters, tool.required) if tool else dict(c.arguments)
        out.append({"name": c.name, "arguments": args})
    return _dumps(out)


def target_token_mask(
    backend: Any, calls: Sequence[Call], tools: Sequence[Tool], decoder: TemplateDecoder | None = None
) -> tuple[list[int], list[bool]]:
    """Token ids of `render_target(calls, tools)` segmented exactly as the decoder feeds them, and
    a mask of the tokens whose logits drive the decoder's decisions (put the SFT loss there):
    tokens the model generates (name prefixes up to uniqueness, choices of ``,``/``]``/``}``,
    optional keys, values with their closing quote) and the first token after each peek
    decision (the delimiter ending a number, the ``"`` opening a nullable string, ...).
    Injected boilerplate is False. Raises `TemplateError` when the gold calls are not valid for
    `tools`. Caps (max_calls etc.) are not applied. Pass `decoder` to reuse its vocab tables."""
    dec = decoder or TemplateDecoder(backend)
    ids, _, trained = dec.target(calls, tools)
    return ids, trained
