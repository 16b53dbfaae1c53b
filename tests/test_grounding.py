"""Values the request does not give: the check a small-first router escalates on."""
from __future__ import annotations

from hyfunc.formats.calls import Call
from hyfunc.formats.grounding import (
    NOT_COPIED, NOT_STATED, PERCENTAGE, SEPARATORS, described_examples, form_separators, padded_dates, separators_of,
    stated_numbers, ungrounded_values,
)
from hyfunc.formats.schema import parse_tools

WEATHER = {"name": "get_current_weather", "parameters": {"type": "object", "required": ["location"], "properties": {
    "location": {"type": "string", "description": "The location, in the format of 'City, State (abbr)', such as "
                                                  "'San Francisco, CA'. 'City, Country' if the city has no state."},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "e.g. 'celsius'"},
    "note": {"type": "string", "description": "Anything else the user said."},
    "days": {"type": "integer", "description": "Days to forecast (at most 10).", "default": 3},
    "hourly": {"type": "boolean"}}}}
RIDE = {"type": "function", "function": {"name": "uber.ride", "parameters": {"type": "object", "properties": {
    "loc": {"type": "string", "description": "The start, in the format of 'Street Address, City, State (abbr), Country'."},
    "stops": {"type": "array", "items": {"type": "string", "description": "A stop, e.g. 'Paris, France'"}},
    "seats": {"type": "object", "properties": {"adults": {"type": "integer"}}}}}}}


def _reasons(calls, request: str) -> list[tuple[str, str]]:
    return [(u.path, u.reason) for u in ungrounded_values(calls, [WEATHER, RIDE], request)]


def test_examples_are_read_only_where_a_form_is_announced() -> None:
    assert described_examples("in the format of 'City, State', such as 'Boston, MA'") == ("City, State", "Boston, MA")
    assert described_examples('The date, e.g. "2024-01-31"') == ("2024-01-31",)
    assert described_examples("The user's 'nickname'.") == ()  # quoted, but no form announced
    assert described_examples("Formatted as an ISO date.") == ()  # announced, but nothing quoted to compare


def test_apostrophes_quote_nothing_and_forms_have_their_examples_separators() -> None:
    assert described_examples("The degree (e.g., Bachelor's, Master's, Ph.D.)") == ()
    location = WEATHER["parameters"]["properties"]["location"]["description"]
    assert form_separators(described_examples(location)) == {","}
    assert form_separators(("HH:MM", "14:45")) == {":"}
    assert form_separators(("Twitter, Facebook, Instagram",)) == {",,"}
    assert (separators_of("San Francisco"), separators_of("Boston, MA (USA)")) == ("", ",")


def test_dates_are_padded_only_where_an_example_shows_the_iso_form() -> None:
    assert padded_dates("2023-10-1 to 2023-10-7", ("YYYY-MM-DD to YYYY-MM-DD",)) == "2023-10-01 to 2023-10-07"
    assert padded_dates("from 2024-2-29", ("2024-01-31",)) == "from 2024-02-29"
    assert padded_dates("2023-10-1", ("MM/DD/YYYY",)) == "2023-10-1"  # another form
    assert padded_dates("2023-13-1, 12023-1-1", ("YYYY-MM-DD",)) == "2023-13-1, 12023-1-1"  # not dates


def test_numbers_stated_in_digits_words_and_thousands() -> None:
    assert {3.0, 4.0, 1.5, 1000.0, 2.0, -3.0} <= stated_numbers("A(3,4), 1.5 kg, 1,000 people, two days")
    assert 7.0 not in stated_numbers("a week from now")


def test_a_minus_on_the_digits_states_the_negative_number_only() -> None:
    stated = stated_numbers("the farm at [43.653225, -79.383186], COVID-19 cases from 10-20 May, a loss of 500")
    assert -79.383186 in stated and 79.383186 not in stated  # the sign was written: dropping it is a guess
    assert {19.0, 20.0, -500.0, 500.0} <= stated  # hyphens and dashes are no signs; a sign may be said in words


def test_a_string_without_the_described_separators_is_ungrounded() -> None:
    weather = Call("get_current_weather", {"location": "San Francisco", "unit": "fahrenheit"})
    assert _reasons([weather], "Weather in San Francisco?") == [("location", SEPARATORS)]
    found = ungrounded_values([weather], [WEATHER], "Weather in San Francisco?")[0]
    assert "'San Francisco, CA'" in str(found) and found.tool == "get_current_weather"


def test_a_string_in_the_form_must_be_the_requests_own_words() -> None:
    completed = Call("get_current_weather", {"location": "Boston, CA"})  # the state guessed, wrongly
    assert _reasons([completed], "Weather in Boston?") == [("location", NOT_COPIED)]
    copied = Call("get_current_weather", {"location": "Riga,  latvia"})  # case and spacing aside, copied
    assert _reasons([copied], "How cold is it in Riga, Latvia today?") == []
    # Parenthesised notes in an example are not part of the form: four parts, three commas.
    address = Call("uber.ride", {"loc": "221 Baker Street, Berkeley, CA, USA"})
    assert _reasons([address], "An Uber from 221B Baker Street, Berkeley, CA, USA") == [("loc", NOT_COPIED)]
    assert _reasons([{"name": "uber.ride", "arguments": {"loc": "221B Baker Street, Berkeley, CA, USA"}}],
                    "An Uber from 221B Baker Street, Berkeley, CA, USA") == []


def test_a_number_the_request_does_not_state_is_ungrounded() -> None:
    guessed = Call("get_current_weather", {"location": "Oslo, Norway", "days": 7})
    assert _reasons([guessed], "Oslo, Norway next week") == [("days", NOT_STATED)]
    assert "states no such number" in str(ungrounded_values([guessed], [WEATHER], "Oslo, Norway next week")[0])
    assert _reasons([guessed], "Oslo, Norway for seven days") == []
    # The schema's own numbers are given too: the default, and those its description states.
    given = [Call("get_current_weather", {"location": "Oslo, Norway", "days": d}) for d in (3, 10)]
    assert _reasons(given, "Oslo, Norway") == []


def test_a_percentage_is_the_tools_to_read_as_it_stands_or_as_a_fraction() -> None:
    rate = {"type": "function", "function": {"name": "present_value", "parameters": {"type": "object", "properties": {
        "rate": {"type": "number", "description": "Annual interest rate."}, "years": {"type": "integer"}}}}}
    for value in (5, 0.05):
        found = ungrounded_values([Call("present_value", {"rate": value, "years": 10})], [rate], "at 5 % for 10 years")
        assert [(u.path, u.reason) for u in found] == [("rate", PERCENTAGE)]
    assert ungrounded_values([Call("present_value", {"rate": 0.05, "years": 10})], [rate], "rate 0.05, 10 years") == []
    # An integer parameter takes the percentage as stated: nothing for the large model to decide.
    discount = {"type": "function", "function": {"name": "discount", "parameters": {"type": "object", "properties": {
        "percent": {"type": "integer", "description": "Discount in percent."}}}}}
    assert ungrounded_values([Call("discount", {"percent": 15})], [discount], "take 15% off") == []


def test_enums_booleans_undescribed_strings_and_unknown_tools_are_not_checked() -> None:
    calls = [Call("get_current_weather", {"location": "Oslo, Norway", "unit": "celsius", "note": "hurry",
                                          "hourly": True}),
             Call("no_such_tool", {"location": "x", "n": 99}), {"name": "no_such_tool", "arguments": {"n": 7}}]
    assert _reasons(calls, "Oslo, Norway, quickly") == []


def test_nested_values_are_checked_against_their_own_schema() -> None:
    ride = Call("uber.ride", {"stops": ["Paris, France", "Lyon"], "seats": {"adults": 2}})
    assert _reasons([ride], "Stops: Paris, France and Lyon") == [("stops[1]", SEPARATORS), ("seats.adults", NOT_STATED)]
    assert ungrounded_values([ride], parse_tools([RIDE]), "Stops: Paris, France and Lyon, 2 adults") == [
        ungrounded_values([ride], [RIDE], "Stops: Paris, France and Lyon")[0]]
