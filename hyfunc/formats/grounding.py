"""Argument values the request does not give: what a small-first router escalates.

The small path's 0.5B was trained on requests whose values copy their words, and it copies well.
Where a value must come from elsewhere it guesses, and the cascade's large model, which writes
values reading the request and the description, does better. So an answer goes to the cascade when
it holds a value that is

- a number the request does not state (in digits, or as a word up to twelve) and the parameter's
  own description or default do not either: find_roots(a=1, b=1) for "the roots of bx + c = 0";
- a number the request states as a percentage, written as it stands or as a fraction ("5 %" as 5
  or 0.05), unless the parameter is an integer: which one depends on the tool (fc-train's own
  answers write 9 of 50 such values as fractions), so the model that reads the description decides;
- a string whose parameter's description prescribes a form by quoted examples ("in the format of
  'City, State (abbr)', such as 'San Francisco, CA'"), where the value lacks the separators
  (``, / : ; @``) of every example ("San Francisco"; a parenthesised note like "(abbr)" is not part
  of the form), or has them without being the request's own words ("Boston, CA" from "Boston",
  "221 Baker Street" from "221B Baker Street"). Descriptions that announce no form ("format",
  "e.g.", "such as", "for example") or quote none are not read.

Enum members and booleans are never checked: the schema gives them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from hyfunc.formats.calls import Call, calls_from_records
from hyfunc.formats.schema import Param, Tool, parse_tools

_CUE = re.compile(r"\bformat|e\.g\.|such as|for example|\bexample", re.IGNORECASE)
# A single quote inside a word is an apostrophe ("Bachelor's, Master's" quotes nothing).
_QUOTED = re.compile(r"(?<!\w)'([^'\n]{1,80})'(?!\w)|\"([^\"\n]{1,80})\"")
_SEPARATORS = re.compile(r"[,/:;@]")
_NOTE = re.compile(r"\([^)]*\)")
_SPACE = re.compile(r"\s+")
# A minus is the number's sign only where it is not a hyphen or a range's dash ("COVID-19", "10-20").
_NUMBER = re.compile(r"((?<![\w.])[-\u2212])?(\d+(?:\.\d+)?)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_COMMA_LIST = re.compile(r"(?<![\d.,])\d+(?:,\d+)+(?![\d.]\d)")  # "5,10", "1,000": digits joined by commas
_NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}

SEPARATORS, NOT_COPIED, NOT_STATED, PERCENTAGE = "separators", "not copied", "number not stated", "percentage"
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*(?:%|per ?cent\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Ungrounded:
    tool: str
    path: str  # the argument's path, e.g. "location" or "stops[1]"
    value: Any
    reason: str  # SEPARATORS | NOT_COPIED | NOT_STATED | PERCENTAGE
    examples: tuple[str, ...] = ()  # the description's quoted examples (string forms)

    def __str__(self) -> str:
        where = f"{self.tool}.{self.path}={self.value!r}"
        shown = ", ".join(repr(e) for e in self.examples)
        if self.reason == SEPARATORS:
            return f"{where} lacks the form of {shown}"
        if self.reason == NOT_COPIED:
            return f"{where} has the form of {shown} but is not the request's words"
        if self.reason == PERCENTAGE:
            return f"{where}: the request gives it as a percentage, which a tool may take as a fraction"
        return f"{where}: the request states no such number"


def described_examples(description: str) -> tuple[str, ...]:
    """The quoted examples of a description that announces a form; () when it announces none."""
    if not _CUE.search(description):
        return ()
    return tuple(a or b for a, b in _QUOTED.findall(description))


def form_separators(examples: Sequence[str]) -> frozenset[str]:
    """The separators (``, / : ; @``, in order) of each example of a form (`described_examples`:
    'City, State (abbr)', 'San Francisco, CA' give {","}). A value in that form has the separators
    of one of them (`separators_of`)."""
    return frozenset(_separators(example) for example in examples)


def separators_of(text: str) -> str:
    """The separators of `text`, in order, leaving out a parenthesised note ("Boston, MA (USA)": ",")."""
    return _separators(text)


_ISO_DATE_FORM = re.compile(r"YYYY-MM-DD|(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
_LOOSE_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{1,2})-(\d{1,2})(?!\d)")


def padded_dates(value: str, examples: Sequence[str]) -> str:
    """`value` with its dates in two-digit months and days where an example shows the ISO form
    ('YYYY-MM-DD', '2024-01-31'): "2023-10-1 to 2023-10-7" as "2023-10-01 to 2023-10-07"."""
    if not any(_ISO_DATE_FORM.search(example) for example in examples):
        return value

    def padded(m: re.Match) -> str:
        month, day = int(m[2]), int(m[3])
        return f"{m[1]}-{month:02d}-{day:02d}" if 1 <= month <= 12 and 1 <= day <= 31 else m[0]

    return _LOOSE_DATE.sub(padded, value)


def listed_item(number: str, request: str) -> str:
    """`number`, or the first item of the request's comma-joined list of numbers that it reads as
    one number: "5,10" read as 510 gives 5. A list whose commas may all be thousands separators
    ("1,000") is one number, left as it is."""
    for match in _COMMA_LIST.finditer(request):
        span = match.group()
        if span.replace(",", "") == number and _THOUSANDS.sub("", span) != number:
            return span.split(",")[0]
    return number


def stated_numbers(text: str) -> set[float]:
    """Numbers `text` states, in digits ("1,000" read both as 1000 and as 1 and 0) or as words up to
    twelve. A minus written on the digits ("-79.38") states the negative number only; any other
    number either sign, as a sign is often said in words ("a loss of 1000", "3 below zero")."""
    found: set[float] = set()
    for t in (text, _THOUSANDS.sub("", text)):
        for sign, digits in _NUMBER.findall(t):
            found |= {-float(digits)} if sign else {float(digits), -float(digits)}
    words = {float(_NUMBER_WORDS[w]) for w in re.findall(r"[a-z]+", text.lower()) if w in _NUMBER_WORDS}
    return found | words | {-n for n in words}


def _separators(text: str) -> str:
    return "".join(_SEPARATORS.findall(_NOTE.sub("", text)))


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


class _Request:
    def __init__(self, text: str):
        self.text, self.numbers = _normal(text), stated_numbers(text)
        self.percentages = {float(p) for p in _PERCENT.findall(text)}


def _check(value: Any, param: Param, request: _Request) -> tuple[str, tuple[str, ...]] | None:
    if param.enum is not None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        # An integer parameter cannot take a fraction: its value is the percentage as stated.
        if param.type != "integer" and any(math.isclose(float(value), p) or math.isclose(float(value), p / 100)
                                           for p in request.percentages):
            return PERCENTAGE, ()
        own = stated_numbers(param.description) | stated_numbers(str(param.default) if param.has_default else "")
        return None if float(value) in request.numbers | own else (NOT_STATED, ())
    if not isinstance(value, str):
        return None
    examples = described_examples(param.description)
    if not examples:
        return None
    if _separators(value) not in form_separators(examples):
        return SEPARATORS, examples
    return None if _normal(value) in request.text else (NOT_COPIED, examples)


def _walk(value: Any, param: Param, path: str, request: _Request) -> Iterable[tuple[str, Any, str, tuple[str, ...]]]:
    if isinstance(value, list):
        if param.items is not None:
            for i, item in enumerate(value):
                yield from _walk(item, param.items, f"{path}[{i}]", request)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in param.properties:
                yield from _walk(item, param.properties[key], f"{path}.{key}", request)
    else:
        found = _check(value, param, request)
        if found is not None:
            yield path, value, *found


def ungrounded_values(calls: Iterable[Call | Mapping[str, Any]], tools: Sequence[Tool | Mapping[str, Any]],
                      request: str) -> list[Ungrounded]:
    """Every argument of `calls` (Call objects or {"name", "arguments"} mappings) that `request`
    does not give (see the module docstring). Calls of tools not offered are skipped: the schema
    check (hyfunc.formats.validate) reports those."""
    by_name = {tool.name: tool for tool in parse_tools(tools)}
    said = _Request(request)
    found: list[Ungrounded] = []
    for call in calls_from_records(calls):
        tool = by_name.get(call.name)
        if tool is None:
            continue
        for key, value in call.arguments.items():
            if key in tool.parameters:
                for path, written, reason, examples in _walk(value, tool.parameters[key], key, said):
                    found.append(Ungrounded(tool.name, path, written, reason, examples))
    return found
