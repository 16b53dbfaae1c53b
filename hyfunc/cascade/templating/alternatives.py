"""Alternatives the request lists for one value: "the resistivity of copper and aluminum", "a 2 and
4 GB machine", "tigers in Bangladesh and India". Each asks for one more call with the other value,
and the small model tends to stop after the first (issue 18: too few calls on parallel requests).
When the calls so far use a value whose listed alternative none of them uses, the walker writes
another call instead of letting the model close the list; the model then writes that call as
usual (the repeat guard still takes back a call that repeats an earlier one).

Only same-shaped neighbours count: a number next to a number, or a phrase of as many words with
the same capitalisation, joined by "and", "or", "&" or a comma (and an article where the value has
one); filler words never count. Only an argument's own value lists alternatives: the items of an
array value are the tool taking the list itself ("points per game, assists and minutes per game" as
one `stats_fields` array)."""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

_JOIN = r"(?:\s*,\s*(?:and|or)\s+|\s*,\s*|\s+(?:and|or|&)\s+)"
_NUMBER = r"-?\d+(?:\.\d+)?"
# "the length and the width": where the value has an article, so may its listed neighbour.
_ARTICLE = r"(?:(?:the|a|an)\s+)"
_MAX_WORDS = 3
# Words that join or frame a phrase rather than name a value.
_FILLER = frozenset(
    "a an the this that these those all any some both either each every other another such own "
    "i me my mine you your yours he him his she her hers it its we us our ours they them their theirs "
    "is are was were be been am do does did have has had will would can could should may might must "
    "also then too so just only more most very not no nor please "
    "for in on at to of with from by as into over under about than and or but if".split()
)


def _leaves(value: Any, in_array: bool = False) -> Iterable[tuple[Any, bool]]:
    """(scalar, inside an array?) for every scalar in `value`."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item, in_array)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, True)
    elif not isinstance(value, bool) and isinstance(value, (str, int, float)):
        yield value, in_array


def _spelled(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def call_values(calls: list[dict]) -> tuple[list[str], list[str]]:
    """The scalar values in `calls` (the decoder's `{"name", "arguments"}` objects) as text: (those
    that may list alternatives, array items excluded; all of them)."""
    leaves = [(_spelled(v), in_array) for call in calls for v, in_array in _leaves(call.get("arguments", {}))]
    return [v for v, in_array in leaves if not in_array], [v for v, _ in leaves]


def _is_number(text: str) -> bool:
    return re.fullmatch(_NUMBER, text) is not None


def _shape_of(text: str) -> tuple[int, bool] | None:
    """(words, capitalised?) of a phrase that may name a value; None for filler or too long."""
    words = text.split()
    if not 1 <= len(words) <= _MAX_WORDS or any(w.lower() in _FILLER for w in words):
        return None
    return len(words), words[0][:1].isupper()


def _neighbours(request: str, start: int, end: int, number: bool, words: int) -> list[str]:
    item = _NUMBER if number else r"[^\W\d_]+(?:\s+[^\W\d_]+){%d}" % (words - 1)
    article = re.search(r"(?<!\w)" + _ARTICLE + "$", request[:start], re.IGNORECASE)
    join = _JOIN + (_ARTICLE + "?" if article else "")
    found = []
    after = re.match(join + r"(" + item + r")(?!\w)", request[end:], re.IGNORECASE)
    if after:
        found.append(after.group(1))
    before_text = request[: article.start()] if article else request[:start]
    before = re.search(r"(?<!\w)(" + item + r")" + _JOIN + r"$", before_text, re.IGNORECASE)
    if before:
        found.append(before.group(1))
    return found


def uncovered_alternative(
    request: str, values: list[str], skip: Iterable[str] = (), used: Iterable[str] = ()
) -> str | None:
    """A value the request lists next to one of `values` that is none of `values` or `used` (lower
    case), other than those in `skip`; None if there is none."""
    used = {v.lower() for v in [*values, *used]}
    skip = {s.lower() for s in skip}
    for value in dict.fromkeys(values):
        number = _is_number(value)
        shape = None if number else _shape_of(value)
        if not number and shape is None:
            continue
        for match in re.finditer(r"(?<![\w.])" + re.escape(value) + r"(?![\w])", request, re.IGNORECASE):
            written = match.group(0)  # as the request spells it: its capitalisation decides the shape
            for other in _neighbours(request, match.start(), match.end(), number, shape[0] if shape else 1):
                key = other.lower()
                if key in used or key in skip:
                    continue
                if not number and _shape_of(other) != _shape_of(written):
                    continue
                return key
    return None


def uncovered_in_text(request: str, text: str, skip: Iterable[str] = ()) -> str | None:
    """`uncovered_alternative` for the decoder's output so far (a call list without its `]`)."""
    try:
        calls = json.loads(text + "]")
    except json.JSONDecodeError:
        return None
    listing, used = call_values(calls)
    return uncovered_alternative(request, listing, skip, used)
