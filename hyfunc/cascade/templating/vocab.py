"""What each token of the small model's vocabulary can be inside templated JSON.

Per tokenizer, once: the text of every token, masks of the tokens that continue a JSON string
(plain, ending inside an escape, ending with the closing quote), tokens that start punctuation,
and the JSON number grammar as a character automaton, so that a constrained step is one masked
argmax. Tokens that are partial UTF-8 sequences are never allowed.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import torch

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


NUM_CHARS = set("0123456789-+.eE")
_DIGITS = set("0123456789")
# JSON number automaton. Accepting states: zero, int, frac, exp, exp2.
NUMBER_ACCEPT = {"zero", "int", "frac", "exp", "exp2"}


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


class Vocab:
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
            if all(ch in NUM_CHARS for ch in s):
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


_VOCABS: dict[tuple[int, int], tuple[Any, Vocab]] = {}



def vocab_for(tokenizer: Any, size: int) -> Vocab:
    key = (id(tokenizer), size)
    hit = _VOCABS.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    vocab = Vocab(tokenizer, size)
    if len(_VOCABS) >= 4:
        _VOCABS.pop(next(iter(_VOCABS)))
    _VOCABS[key] = (tokenizer, vocab)  # keeps the tokenizer alive so the id is not reused
    return vocab

