import copy
import json
from pathlib import Path

import pytest

from hyfunc.formats.schema import NO_DEFAULT, Param, SchemaError, parse_tool, parse_tools

FIXTURES = Path(__file__).parent / "fixtures"

# Shaped like BFCL's simple_python docs: Python type names, nested dict, tuple, any, enum, default.
BFCL_DOC = {
    "name": "math.hypot",
    "description": "Calculate the Euclidean norm.",
    "parameters": {
        "type": "dict",
        "properties": {
            "x": {"type": "integer", "description": "The x-coordinate."},
            "y": {"type": "float", "description": "The y-coordinate."},
            "point": {"type": "tuple", "items": {"type": "string"}, "description": "A point."},
            "opts": {
                "type": "dict",
                "description": "Options.",
                "properties": {
                    "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
                    "tags": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                },
                "required": ["mode"],
            },
            "extra": {"type": "any", "description": "Anything.", "default": None},
            "meta": {"type": "dict", "description": "Free-form, no properties."},
        },
        "required": ["x", "y"],
    },
}

OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def load_toolrl_example() -> dict:
    return json.loads((FIXTURES / "toolrl_example.jsonl").read_text().splitlines()[0])


def test_reads_real_training_tools_with_spaces_and_defaults():
    example = load_toolrl_example()
    tools = parse_tools(example["tools"])
    assert [t.name for t in tools][:2] == ["symbols", "Bearish Harami"]
    rsi = next(t for t in tools if t.name == "RSI Overbought Stocks")
    assert rsi.required == ["page"] and rsi.optional == []
    assert rsi.parameters["page"] == Param("integer", "Page number for pagination", default=1)
    bearish = tools[1]
    assert bearish.optional == ["page"]
    assert bearish.parameters["page"].type == "number"
    # The JSON Schema form is written back exactly as read.
    assert [t.to_json_schema() for t in tools] == example["tools"]


def test_reads_bfcl_doc_and_keeps_source_types():
    tool = parse_tool(BFCL_DOC)
    assert tool.name == "math.hypot"
    assert tool.required == ["x", "y"]
    assert tool.optional == ["point", "opts", "extra", "meta"]
    y, point, opts = tool.parameters["y"], tool.parameters["point"], tool.parameters["opts"]
    assert (y.type, y.source_type) == ("number", "float")
    assert (point.type, point.source_type, point.items.type) == ("array", "tuple", "string")
    assert (opts.type, opts.required) == ("object", ["mode"])
    assert opts.properties["mode"].enum == ["fast", "exact"]
    assert opts.properties["mode"].default == "fast"
    assert opts.properties["tags"].items.items.type == "integer"
    assert tool.parameters["extra"].type == "any"
    assert tool.to_bfcl() == BFCL_DOC


def test_bfcl_doc_as_json_schema_uses_standard_names():
    schema = parse_tool(BFCL_DOC).to_json_schema()["parameters"]
    assert schema["type"] == "object"
    assert schema["properties"]["y"]["type"] == "number"
    assert schema["properties"]["point"] == {"type": "array", "description": "A point.", "items": {"type": "string"}}
    assert schema["properties"]["opts"]["type"] == "object"
    # JSON Schema spells "any" by leaving the type out.
    assert schema["properties"]["extra"] == {"description": "Anything.", "default": None}


def test_reads_openai_tool_and_round_trips():
    tool = parse_tool(OPENAI_TOOL)
    assert tool.name == "get_weather"
    unit = tool.parameters["unit"]
    assert (unit.type, unit.enum) == ("string", ["celsius", "fahrenheit"])
    assert parse_tool(tool.to_openai()) == tool
    assert tool.to_openai()["function"]["parameters"]["properties"]["city"] == {"type": "string", "description": "City name."}


def test_json_schema_to_bfcl_uses_bfcl_names():
    tool = parse_tool({
        "name": "f",
        "parameters": {"type": "object", "properties": {
            "n": {"type": "number"}, "o": {"type": "object"}, "l": {"type": "array"},
        }},
    })
    props = tool.to_bfcl()["parameters"]["properties"]
    assert props == {"n": {"type": "float"}, "o": {"type": "dict"}, "l": {"type": "array"}}


def test_default_none_is_distinct_from_no_default():
    tool = parse_tool(BFCL_DOC)
    assert tool.parameters["extra"].has_default and tool.parameters["extra"].default is None
    assert not tool.parameters["x"].has_default and tool.parameters["x"].default is NO_DEFAULT
    assert copy.deepcopy(tool.parameters["x"]).default is NO_DEFAULT


def test_tool_without_parameters():
    tool = parse_tool({"type": "function", "function": {"name": "now"}})
    assert tool.parameters == {} and tool.required == []
    assert tool.to_json_schema()["parameters"] == {"type": "object", "properties": {}, "required": []}


def test_python_type_aliases():
    tool = parse_tool({"name": "f", "parameters": {"type": "dict", "properties": {
        "a": {"type": "str"}, "b": {"type": "int"}, "c": {"type": "bool"}, "d": {"type": "list"}, "e": {"type": "double"},
    }}})
    assert [p.type for p in tool.parameters.values()] == ["string", "integer", "boolean", "array", "number"]


def bad_tool(**param):
    return {"name": "get_weather", "parameters": {"type": "object", "properties": {"units": param}}}


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            bad_tool(type="object", properties={"kind": {"type": "strng"}}),
            "tool 'get_weather': parameter 'units.kind': unknown type 'strng'",
        ),
        (bad_tool(type="array", items={"type": "flaot"}), "tool 'get_weather': parameter 'units[]': unknown type 'flaot'"),
        (bad_tool(type="string", enum="celsius"), "tool 'get_weather': parameter 'units': enum must be a list"),
        (
            bad_tool(type="object", properties={"a": {"type": "string"}}, required=["b"]),
            "tool 'get_weather': parameter 'units': required: 'b' is not a defined property",
        ),
        (
            {"name": "get_weather", "parameters": {"type": "object", "properties": {}, "required": ["city"]}},
            "tool 'get_weather': required: 'city' is not a defined property",
        ),
        (
            {"name": "get_weather", "parameters": {"type": "string"}},
            "tool 'get_weather': parameters: must be an object schema",
        ),
        ({"name": "get_weather", "parameters": ["city"]}, "tool 'get_weather': parameters: must be an object schema"),
        ({"name": "", "parameters": {}}, "name: must be a non-empty string"),
        ({"description": "no name"}, "name: must be a non-empty string, got None"),
        (bad_tool(type=3), "tool 'get_weather': parameter 'units': type must be a string"),
        ({"type": "function", "function": "get_weather"}, "not an OpenAI tool"),
    ],
)
def test_malformed_tools_name_the_field(doc, message):
    with pytest.raises(SchemaError) as info:
        parse_tool(doc)
    assert message in str(info.value)


def test_duplicate_tool_names_rejected():
    with pytest.raises(SchemaError, match="tool 'get_weather': duplicate tool name"):
        parse_tools([OPENAI_TOOL, OPENAI_TOOL["function"]])


def test_parse_tools_accepts_tool_objects_and_mixed_formats():
    tools = parse_tools([parse_tool(BFCL_DOC), OPENAI_TOOL])
    assert [t.name for t in tools] == ["math.hypot", "get_weather"]
