"""Direct prompting: stopping rule and output parsing (tiny model; the real one is in the integration test)."""
import pytest

from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import ArgumentError
from hyfunc.methods.direct import DirectMethod, _python_answer_done
from tests.tiny_models import tiny_backend

PROSE = "To calculate the factorial of 5 using math functions, you can use the `math.factorial` helper (see docs)"


@pytest.mark.parametrize(
    "text, done",
    [
        ("[f(a=1)]", True),
        ("[f(a=1), g(b='x, y')]", True),
        ("[f(a=1", False),
        ("[f(a='])", False),  # the bracket is inside an unfinished string
        (PROSE, True),  # long prose: no call can follow
        ("short prose", False),
        ("math.factorial(number=5) " + "and more words " * 6, False),  # a call without brackets may go on
        ("```python\n[f(a=1)]\n```", True),
        ('{"name": "send_money", "arguments": {"recipient": "GB29NWBK60161331926819", "amount": 4.0', False),
        ('<tool_call>\n{"name": "send_money", "arguments": {"recipient": "GB29NWBK60161331926819", "amount"', False),
    ],
)
def test_stop_rule(text, done):
    assert _python_answer_done(text) is done


def test_parse_reads_call_lists_fences_and_prose():
    method = DirectMethod(tiny_backend(), style="bfcl")
    assert method.parse('[get_weather(city="Paris")]') == [Call("get_weather", {"city": "Paris"})]
    assert method.parse('```python\n[f(x=[1, 2])]\n```') == [Call("f", {"x": [1, 2]})]
    assert method.parse("I cannot help with that.") == []


def test_answer_reports_tokens_and_timings():
    method = DirectMethod(tiny_backend(), style="bfcl", max_new_tokens=4)
    tools = parse_tools([{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}])
    answer = method.answer([{"role": "user", "content": "call f"}], tools)
    assert answer.input_tokens > 0 and 0 < answer.output_tokens <= 4
    assert set(answer.timings) == {"prefill", "decode"}
    assert answer.error is not None or isinstance(answer.calls, list)


def test_unknown_style_is_rejected():
    with pytest.raises(ValueError, match="unknown prompt style"):
        DirectMethod(tiny_backend(), style="xml")


WEATHER = parse_tools([{"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}])


def test_calls_are_checked_against_the_schemas():
    method = DirectMethod(tiny_backend(), style="bfcl")
    assert method.checked_calls('[get_weather(city="Oslo")]', WEATHER) == [Call("get_weather", {"city": "Oslo"})]
    assert method.checked_calls("No tool fits this request.", WEATHER) == []
    # One valid call and one invalid: the whole list is refused, every problem named.
    with pytest.raises(ArgumentError) as info:
        method.checked_calls('[get_weather(city="Oslo"), get_weather(unit="kelvin"), get_time()]', WEATHER)
    assert info.value.errors == [
        "get_weather: argument 'unit': 'kelvin' is not one of ['celsius', 'fahrenheit']",
        "get_weather: missing required argument 'city'",
        "unknown tool 'get_time'; offered: get_weather",
    ]
    assert info.value.calls == [{"get_weather": {"city": "Oslo"}}, {"get_weather": {"unit": "kelvin"}}, {"get_time": {}}]
