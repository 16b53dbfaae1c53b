import json

import pytest

from hyfunc.formats.calls import (
    Call,
    CallParseError,
    from_openai_tool_calls,
    parse_calls,
    parse_json_calls,
    parse_python_calls,
    parse_tool_call_blocks,
    render_json_calls,
    render_python_calls,
    render_tool_call_blocks,
    same_calls,
    to_bfcl_output,
    to_openai_tool_calls,
)

TRICKY = [
    Call("math.factorial", {"n": 5}),
    Call(
        "search",
        {
            "query": 'he said "hi", then [left] (quickly) \'ok\' = done}',
            "limit": -3,
            "ratio": -0.25,
            "flags": [True, False, None],
            "nested": {"a": [1, [2, {"b": "c,d"}]], "e": {}},
            "unicode": "Zürich → 東京\n",
        },
    ),
    Call("noargs", {}),
]


def test_python_parses_bfcl_list():
    calls = parse_python_calls('[get_weather(city="Paris", unit="celsius"), math.factorial(n=5)]')
    assert calls == [Call("get_weather", {"city": "Paris", "unit": "celsius"}), Call("math.factorial", {"n": 5})]


def test_python_without_brackets_and_newline_separated():
    assert parse_python_calls("f(a=1)") == [Call("f", {"a": 1})]
    assert parse_python_calls("f(a=1), g(b=-2.5)") == [Call("f", {"a": 1}), Call("g", {"b": -2.5})]
    assert parse_python_calls("f(a=1)\ng(b=None)") == [Call("f", {"a": 1}), Call("g", {"b": None})]
    assert parse_python_calls("[]") == [] and parse_python_calls("  ") == []


def test_python_tuples_become_lists():
    (call,) = parse_python_calls("f(p=(1, 2), q=[(3,), {'k': (4, 5)}])")
    assert call.arguments == {"p": [1, 2], "q": [[3], {"k": [4, 5]}]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("[f(1)]", "call 0 (f): positional argument '1'; arguments must be passed by keyword"),
        ("[f(a=1), g(x)]", "call 1 (g): positional argument 'x'"),
        ("[f(a=x)]", "call 0 (f): argument 'a': unsupported value 'x'"),
        ("[f(a=__import__('os').system('ls'))]", "call 0 (f): argument 'a': unsupported value"),
        ("[f(a=[1, 2 + 3])]", "argument 'a'[1]: unsupported value '2 + 3'"),
        ("[f(a=1, a=2)]", "argument 'a' given twice"),
        ("[f(**kw)]", "'**' unpacking is not allowed"),
        ("[f(a=1), 3]", "call 1: expected a function call, got '3'"),
        ("[f(a=1)", "not valid Python call syntax"),
        ("x = f(a=1)", "got a Assign statement"),
        ("[f(a=1)(b=2)]", "function must be a (dotted) name"),
        ("[f(a=-True)]", "unsupported value '-True'"),
    ],
)
def test_python_errors_are_precise(text, message):
    with pytest.raises(CallParseError) as info:
        parse_python_calls(text)
    assert message in str(info.value)


def test_python_round_trip():
    text = render_python_calls(TRICKY)
    assert text.startswith("[math.factorial(n=5), search(query=")
    assert parse_python_calls(text) == TRICKY
    assert render_python_calls([]) == "[]"


@pytest.mark.parametrize(
    "call, message",
    [
        (Call("Search Managers", {}), "'Search Managers' is not a dotted Python identifier"),
        (Call("products/list", {}), "not a dotted Python identifier"),
        (Call("f", {"class": 1}), "argument name 'class' is not a Python identifier"),
        (Call("f", {"x": float("nan")}), "no Python literal form"),
        (Call("f", {"x": {1, 2}}), "cannot write a set value"),
    ],
)
def test_python_render_rejects_unwritable(call, message):
    with pytest.raises(ValueError, match=message):
        render_python_calls([call])


def test_json_single_list_and_string_arguments():
    assert parse_json_calls('{"name": "f", "arguments": {"a": 1}}') == [Call("f", {"a": 1})]
    assert parse_json_calls('[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "arguments": "{\\"b\\": [1]}"}]') == [
        Call("f", {"a": 1}),
        Call("g", {"b": [1]}),
    ]
    # One object per line, as some models write parallel calls.
    assert parse_json_calls('{"name": "f", "arguments": {}}\n{"name": "g"}') == [Call("f"), Call("g")]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"name": "f", "arguments": {"a": 1}', "invalid JSON (line 1, column 36): Expecting ',' delimiter"),
        ('{"arguments": {}}', "call 0: 'name' must be a non-empty string, got None"),
        ('[{"name": "f"}, {"name": "g", "arguments": [1]}]', "call 1 (g): 'arguments' must be an object, got list"),
        ('{"name": "f", "arguments": "{oops"}', "call 0 (f): 'arguments' is a string but not valid JSON"),
        ("[1]", "call 0: expected an object with 'name' and 'arguments'"),
    ],
)
def test_json_errors_are_precise(text, message):
    with pytest.raises(CallParseError) as info:
        parse_json_calls(text)
    assert message in str(info.value)


def test_json_round_trip():
    text = render_json_calls(TRICKY)
    assert json.loads(text)[0] == {"name": "math.factorial", "arguments": {"n": 5}}
    assert parse_json_calls(text) == TRICKY


def test_tool_call_blocks_parallel_and_round_trip():
    text = render_tool_call_blocks(TRICKY)
    assert text.count("<tool_call>\n{") == 3 and text.count("}\n</tool_call>") == 3
    assert parse_tool_call_blocks(text) == TRICKY
    # Qwen's chat template form, with surrounding prose, and an unclosed last block.
    qwen = 'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}'
    assert parse_tool_call_blocks(qwen) == [Call("a", {"x": 1}), Call("b", {})]


def test_fenced_json_blocks():
    text = 'Here you go:\n```json\n[{"name": "a", "arguments": {"x": "```"}}]\n```\n'
    # A backtick run inside a JSON string ends the fence early; the parser must say so, not guess.
    with pytest.raises(CallParseError):
        parse_tool_call_blocks(text)
    text = '```json\n{"name": "a", "arguments": {"x": 1}}\n```\nand\n```\n{"name": "b", "arguments": {}}\n```'
    assert parse_tool_call_blocks(text) == [Call("a", {"x": 1}), Call("b", {})]
    assert parse_tool_call_blocks("no calls here") == []
    assert parse_tool_call_blocks("```python\nprint(1)\n```") == []


def test_openai_tool_calls_round_trip():
    wire = to_openai_tool_calls(TRICKY)
    assert [w["type"] for w in wire] == ["function"] * 3
    assert all(w["id"].startswith("call_") for w in wire) and len({w["id"] for w in wire}) == 3
    assert json.loads(wire[1]["function"]["arguments"]) == TRICKY[1].arguments
    assert from_openai_tool_calls(wire) == TRICKY
    with pytest.raises(CallParseError, match=r"tool_calls\[0\]: 'name' must be a non-empty string"):
        from_openai_tool_calls([{"id": "x", "type": "function", "function": {"arguments": "{}"}}])


def test_bfcl_output():
    assert to_bfcl_output([Call("f", {"a": 1}), Call("f", {"a": 2})]) == [{"f": {"a": 1}}, {"f": {"a": 2}}]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[get_weather(city="Paris")]', [Call("get_weather", {"city": "Paris"})]),
        ('math.factorial(n=5)', [Call("math.factorial", {"n": 5})]),
        ('{"name": "f", "arguments": {"a": 1}}', [Call("f", {"a": 1})]),
        ('[{"name": "f", "arguments": {"a": 1}}]', [Call("f", {"a": 1})]),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', [Call("f", {"a": 1})]),
        ('<think>I should call f(a=1).</think>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', [Call("f", {"a": 1})]),
        ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', [Call("f", {"a": 1})]),
        ("```python\n[f(a=1), g(b='x')]\n```", [Call("f", {"a": 1}), Call("g", {"b": "x"})]),
        ("[]", []),
        ("", []),
        ("   \n", []),
        ("I'm sorry, none of the available tools can book flights (yet).", []),
        ("<think>nothing fits</think>I cannot help with that.", []),
    ],
)
def test_parse_calls_detects_format(text, expected):
    assert parse_calls(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ('[get_weather(city="Paris"', "not valid Python call syntax"),
        ('{"name": "f", "arguments": {"a": 1}', "invalid JSON"),
        ('<tool_call>\n{"name": "f", "arguments": }\n</tool_call>', "invalid JSON"),
        ('Sure, I will call get_weather(city="Paris") now.', "call-like text 'get_weather(city=' inside prose"),
        ('The call is {"name": "f"} I think', "call-like text '\"name\":' inside prose"),
        ("[f(1)]", "positional argument"),
    ],
)
def test_parse_calls_rejects_malformed_attempts(text, message):
    with pytest.raises(CallParseError) as info:
        parse_calls(text)
    assert message in str(info.value)


def test_same_calls_ignores_order_but_not_values():
    a = [Call("f", {"x": 1, "y": [1, 2]}), Call("g", {})]
    assert same_calls(a, [Call("g", {}), Call("f", {"y": [1, 2], "x": 1})])
    assert not same_calls(a, [Call("f", {"x": 1, "y": [2, 1]}), Call("g", {})])  # list order is a value
    assert not same_calls(a, [Call("f", {"x": 1, "y": [1, 2]})])  # a call missing
    assert not same_calls([Call("f", {"x": 1})], [Call("f", {"x": 1}), Call("f", {"x": 1})])  # a call repeated
