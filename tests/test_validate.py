import json
from pathlib import Path

import pytest

from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import ArgumentError, argument_errors, validate_call

FIXTURES = Path(__file__).parent / "fixtures"

TOOLS = parse_tools([
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                    "hourly": {"type": "boolean"},
                    "threshold": {"type": "number"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "name": "math.plot",
        "parameters": {
            "type": "dict",
            "properties": {
                "points": {"type": "array", "items": {"type": "tuple", "items": {"type": "float"}}},
                "style": {
                    "type": "dict",
                    "properties": {"kind": {"type": "string", "enum": ["line", "bar"]}, "width": {"type": "integer"}},
                    "required": ["kind"],
                },
                "meta": {"type": "dict"},
                "payload": {"type": "any"},
                "label": {"type": "string", "default": None},
            },
            "required": ["points"],
        },
    },
    {"name": "now", "parameters": {"type": "object", "properties": {}}},
])


def errors(name, **arguments):
    return argument_errors(Call(name, arguments), TOOLS)


def test_valid_calls_have_no_errors():
    assert errors("get_weather", city="Paris", unit="celsius", days=3, hourly=False, threshold=2) == []
    assert errors("get_weather", city="Paris", threshold=2.5) == []
    assert errors(
        "math.plot", points=[[1, 2.5], (3.0, 4)], style={"kind": "bar", "width": 2},
        meta={"anything": [1]}, payload={"x": None}, label=None,
    ) == []
    assert errors("now") == []
    validate_call(Call("now", {}), {t.name: t for t in TOOLS})


def test_unknown_tool_lists_offered():
    assert errors("get_wether", city="Paris") == ["unknown tool 'get_wether'; offered: get_weather, math.plot, now"]


def test_unknown_and_missing_arguments():
    assert errors("get_weather", town="Paris") == [
        "get_weather: unknown argument 'town'; expected one of: city, unit, days, hourly, threshold",
        "get_weather: missing required argument 'city'",
    ]
    assert errors("now", x=1) == ["now: unknown argument 'x'; expected one of: (none)"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"city": 3}, "get_weather: argument 'city': expected string, got integer 3"),
        ({"city": "P", "days": True}, "get_weather: argument 'days': expected integer, got boolean True"),
        ({"city": "P", "days": 2.0}, "get_weather: argument 'days': expected integer, got number 2.0"),
        ({"city": "P", "threshold": "2"}, "get_weather: argument 'threshold': expected number, got string '2'"),
        ({"city": "P", "threshold": False}, "get_weather: argument 'threshold': expected number, got boolean False"),
        ({"city": "P", "hourly": 1}, "get_weather: argument 'hourly': expected boolean, got integer 1"),
        ({"city": None}, "get_weather: argument 'city': expected string, got null None"),
        ({"city": "P", "unit": "kelvin"}, "get_weather: argument 'unit': 'kelvin' is not one of ['celsius', 'fahrenheit']"),
    ],
)
def test_type_and_enum_errors(arguments, message):
    assert argument_errors(Call("get_weather", arguments), TOOLS) == [message]


def test_nested_paths():
    assert errors("math.plot", points=[[1, "2"]], style={"kind": "pie", "extra": 1, "width": "3"}) == [
        "math.plot: argument 'points[0][1]': expected number, got string '2'",
        "math.plot: argument 'style.kind': 'pie' is not one of ['line', 'bar']",
        "math.plot: unknown argument 'style.extra'; expected one of: kind, width",
        "math.plot: argument 'style.width': expected integer, got string '3'",
    ]
    assert errors("math.plot", points={}, style={}) == [
        "math.plot: argument 'points': expected array, got object {}",
        "math.plot: missing required argument 'style.kind'",
    ]


def test_validate_call_raises_with_all_messages():
    with pytest.raises(ArgumentError) as info:
        validate_call(Call("get_weather", {"unit": "kelvin"}), TOOLS)
    assert info.value.errors == [
        "get_weather: argument 'unit': 'kelvin' is not one of ['celsius', 'fahrenheit']",
        "get_weather: missing required argument 'city'",
    ]
    assert str(info.value) == "; ".join(info.value.errors)


def test_real_training_answers_validate():
    example = json.loads((FIXTURES / "toolrl_example.jsonl").read_text().splitlines()[0])
    tools = parse_tools(example["tools"])
    for answer in example["answers"]:
        validate_call(Call(answer["name"], answer["arguments"]), tools)
    # "page" is an integer parameter of this tool: 1.5 must not pass.
    assert argument_errors(Call("RSI Overbought Stocks", {"page": 1.5}), tools) == [
        "RSI Overbought Stocks: argument 'page': expected integer, got number 1.5"
    ]
