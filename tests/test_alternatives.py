"""Alternatives the request lists for one value ("copper and aluminum"): found only next to a value
the calls use, of the same shape; the decoder then writes another call instead of closing the list."""
from __future__ import annotations

import math

import pytest
import torch

from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.cascade.templating.alternatives import call_values, uncovered_alternative, uncovered_in_text
from hyfunc.formats.schema import parse_tools
from tests.test_templating import Wrapped, ids_of
from tests.tiny_models import tiny_backend

RESISTANCE = "the resistance of a 5m wire with an area of 0.01m² and a resistivity of copper and aluminum"


@pytest.mark.parametrize("request_text, values, skip, expected", [
    (RESISTANCE, ["5", "0.01", "copper"], [], "aluminum"),
    (RESISTANCE, ["5", "0.01", "copper", "aluminum"], [], None),  # both used
    (RESISTANCE, ["5", "0.01", "copper"], ["aluminum"], None),  # already written for
    ("What's the cost of 2 and 4 gb ram machines?", ["2"], [], "4"),
    ("the factorial of 5, 10 and 15", ["5"], [], "10"),
    ("the factorial of 5, 10 and 15", ["5", "10"], [], "15"),  # the neighbour of 10, before and after
    ("tigers in Bangladesh and India", ["Bangladesh"], [], "india"),
    ("any music or theater events", ["Music"], [], "theater"),  # the request's spelling decides the shape
    ("flights from New York and Los Angeles", ["New York"], [], "los angeles"),
    ("the length and the width of a rectangle", ["length"], [], "width"),  # articles are not values
    ("the length and the width of a rectangle", ["width"], [], "length"),
    ("the price of apples and a discount", ["apples"], [], None),  # the value has no article
    # a neighbour of another shape: capitalised against lower case, a word against a number, filler
    ("a restaurant in New York and suggest a hotel", ["New York"], [], None),
    ("a wire of 5m and copper", ["5"], [], None),
    ("the weather in Paris and the time", ["Paris"], [], None),
    ("Paris or 5", ["Paris"], [], None),
    ("no alternatives here: Paris", ["Paris"], [], None),
    ("the 2023 budget and 10 more", ["2"], [], None),  # a digit inside a number is not the value
    ("growth in deer and their impact", ["deer"], [], None),  # a pronoun is no alternative
])
def test_uncovered_alternative(request_text, values, skip, expected) -> None:
    assert uncovered_alternative(request_text, values, skip) == expected


def test_values_of_calls_and_of_the_decoders_text() -> None:
    calls = [{"name": "f", "arguments": {"a": "x", "n": 2.0, "flag": True, "items": ["y", {"k": 3}]}}]
    # booleans are not values a request lists; array items list none (the array takes the list)
    assert call_values(calls) == (["x", "2"], ["x", "2", "y", "3"])
    text = '[{"name": "r", "arguments": {"metal": "copper"}}'
    assert uncovered_in_text(RESISTANCE, text) == "aluminum"
    assert uncovered_in_text(RESISTANCE, text[:-3]) is None  # not a whole call yet
    stats = '[{"name": "s", "arguments": {"player": "LeBron James", "fields": ["points_per_game", "assists"]}}'
    assert uncovered_in_text("LeBron James including points per game, assists, and minutes per game", stats) is None
    listed = '[{"name": "r", "arguments": {"metals": ["copper", "aluminum"], "metal": "copper"}}'
    assert uncovered_in_text(RESISTANCE, listed) is None  # an array item covers an alternative


class InTurn:
    """A ValueWriter writing the given strings in turn."""

    model_drafts = False

    def __init__(self, *strings: str):
        self.strings = list(strings)

    def string(self, text_so_far, draft=None, examples=()):
        return self.strings.pop(0) if self.strings else None

    def choice(self, text_so_far, options):
        return None

    def number(self, text_so_far, integer, draft=None):
        return None


def test_decoder_writes_a_call_for_the_alternative_the_model_would_leave_out() -> None:
    backend = tiny_backend()
    close = ids_of(backend, "]")
    w = Wrapped(backend, lambda logits, pos: logits.index_fill(0, torch.tensor(close), math.inf))  # ']' wins
    tools = parse_tools([{"name": "resistance", "parameters": {
        "type": "object", "properties": {"metal": {"type": "string"}}, "required": ["metal"]}}])
    dec = TemplateDecoder(w, max_calls=4)

    def decode(request: str, alternatives: bool, values=("copper", "aluminum", "copper")):
        writer = InTurn(*values)
        out = dec.decode(w.start(request), tools, require_call=True, draft_source=request, write_value=writer,
                         alternatives=alternatives)
        return [c.arguments["metal"] for c in out.calls]

    assert decode(RESISTANCE, alternatives=False) == ["copper"]  # the model closes the list
    assert decode(RESISTANCE, alternatives=True) == ["copper", "aluminum"]  # then nothing is left out
    assert decode("the resistivity of copper", alternatives=True) == ["copper"]  # nothing listed: its choice
    # The extra call repeats the first word for word: the repeat guard takes it back, as before.
    assert decode(RESISTANCE, alternatives=True, values=("copper", "copper")) == ["copper"]
