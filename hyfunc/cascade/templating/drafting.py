"""Guesses that let one forward pass of the small model write several tokens.

A string or number value is mostly a span of the request: the text that follows the value so far
in the request is proposed as a draft. After a value, what the template injects next and guessed
choices (`Follow`: no more optional keys, another call to the next tool the request mentions)
run on in the same pass. The session verifies every drafted token against the model's own
constrained choice, so a wrong guess costs nothing but speed.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from hyfunc.cascade.templating.vocab import NUM_CHARS
from hyfunc.formats.schema import Tool

DRAFT_MATCH_CHARS = 32  # longest end piece of a value looked up in the draft source
DRAFT_LOOKAHEAD_CHARS = 64  # source text after the match that drafts are tokenized from
_QUOTES = set("\"'`\u2018\u2019\u201c\u201d")
CLAUSE_ENDS = set(",.;:!?")


@dataclass(frozen=True)
class Follow:
    """What the decoder feeds after a value or choice when the drafts' guesses hold: `text` the
    template injects (flushed as one piece), then `then`, the tokens of guessed decisions beyond
    it (the next call's opening, name and first key). Empty: a decision comes right after."""

    text: str = ""
    then: tuple[int, ...] = ()

    def after(self, prefix: str) -> Follow:
        return Follow(prefix + self.text, self.then)


DECISION = Follow()


def _name_words(name: str) -> list[str]:
    """"getMobileColorScheme" -> ["get", "mobile", "color", "scheme"] (also snake_case, dots)."""
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]


def mention_order(tools: Sequence[Tool], source: str) -> list[int]:
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


def find_in_source(source: str, piece: str, whole: bool) -> int:
    """Where `piece` occurs in `source` (-1: nowhere); a `whole` value so far is looked for at
    a word's start first ("3" of "ID 31" rather than of "size 73")."""
    if whole and piece[:1].isalnum():
        at = source.find(piece)
        while at > 0 and source[at - 1].isalnum():
            at = source.find(piece, at + 1)
        if at >= 0:
            return at
    return source.find(piece)


def value_end(text: str, i: int, clauses: bool = True) -> bool:
    """Whether a value copied from `text` likely ends before position `i`: at a quote character,
    a control character, or (`clauses`) clause punctuation followed by a space or the end ("in
    Los Angeles.", "iOS, and")."""
    ch = text[i]
    if ch in _QUOTES or ord(ch) < 0x20:
        return True
    return clauses and ch in CLAUSE_ENDS and (i + 1 == len(text) or text[i + 1].isspace())



def copy_draft(text: str, source: str, kind: str) -> tuple[str, bool, bool] | None:
    """The source text likely to continue value `text` (kind "string" or "number"), found by
    the longest recent piece of the value (at least 3 characters, or all of it) in `source`, up to
    the first character the value cannot hold: (draft text, cut short at the lookahead's end so
    its last token may be partial, the source ends the value there). None: nothing to copy."""
    if not text or not source:
        return None
    at, n = -1, min(len(text), DRAFT_MATCH_CHARS)
    while n >= min(len(text), 3) and (at := find_in_source(source, text[-n:], whole=n == len(text))) < 0:
        n -= 1
    if at < 0:
        return None
    rest = source[at + n : at + n + DRAFT_LOOKAHEAD_CHARS]
    source_ends = at + n + len(rest) == len(source)  # the source's end ends a value too
    if kind == "number":
        cut = next((i for i, ch in enumerate(rest) if ch not in NUM_CHARS), len(rest) if source_ends else None)
        ends = cut is not None
        if ends:  # "of 73." ends the number before its period
            cut = len(rest[:cut].rstrip(".eE+-"))
    else:  # string content: up to a character that would need escaping, or the value's end
        # Past punctuation the value already holds, punctuation no longer marks its end.
        clauses = not any(ch in CLAUSE_ENDS for ch in text)
        stops = (i for i, ch in enumerate(rest) if ch in '"\\' or value_end(rest, i, clauses))
        cut = next(stops, len(rest) if source_ends else None)
        ends = cut is not None and (cut == len(rest) or value_end(rest, cut, clauses))
    return rest[:cut], cut is None, ends


def copy_draft_ids(encode: Callable[[str], list[int]], text: str, source: str, kind: str) -> tuple[list[int], bool] | None:
    """`copy_draft` as token ids: (ids, the source ends the value right after them). A draft cut
    short at the lookahead's end loses its last token, which may be partial. None: nothing to copy."""
    draft = copy_draft(text, source, kind)
    if draft is None:
        return None
    piece, cut_short, ends = draft
    ids = encode(piece) if piece else []
    return (ids[:-1], False) if cut_short else (ids, ends)
