"""Free string values written by the large model (cascade/large_values.py): the decoder injects
them, the writer follows the answer text incrementally, and the cascade switch works."""
from __future__ import annotations

import json

import pytest

from hyfunc.cascade.large_values import LargeValueWriter, _closing_quote
from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.formats.validate import argument_errors
from tests.test_templating import TOOLS
from tests.tiny_models import tiny_backend


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


def test_decoder_injects_the_written_strings_and_keeps_the_rest(backend) -> None:
    seen: list[str] = []

    def write(text: str) -> str:
        seen.append(text)
        return 'Boston, "MA"'

    step = backend.forward(ids=backend.encode("weather please"))
    out = TemplateDecoder(backend, max_calls=2, max_string_tokens=6, max_array_items=2).decode(
        step, TOOLS[:1], require_call=True, write_value=write)
    calls = json.loads(out.text)
    assert calls and all(c["arguments"]["city"] == 'Boston, "MA"' for c in calls)
    assert all(not argument_errors(c, TOOLS) for c in out.calls)
    assert seen and all(t.endswith('"city": "') for t in seen[:1])  # asked at the value's opening quote
    for c in calls:  # enums are the small model's choice, never the writer's
        assert c["arguments"].get("unit") in (None, "celsius", "fahrenheit")


def test_decoder_writes_itself_when_the_writer_declines(backend) -> None:
    step = backend.forward(ids=backend.encode("weather please"))
    decoder = TemplateDecoder(backend, max_calls=2, max_string_tokens=6, max_array_items=2)
    mine = decoder.decode(step, TOOLS[:1], require_call=True)
    step = backend.forward(ids=backend.encode("weather please"))
    declined = decoder.decode(step, TOOLS[:1], require_call=True, write_value=lambda text: None)
    assert declined.text == mine.text


def test_writer_follows_the_text_incrementally_and_refork_after_a_rewind(backend) -> None:
    prompt = backend.forward(ids=backend.encode("the prompt"))
    forks = []
    fork = backend.fork

    class Counting:
        def __getattr__(self, name):
            return getattr(backend, name)

        def fork(self, cache):
            forks.append(1)
            return fork(cache)

    writer = LargeValueWriter(Counting(), prompt, max_tokens=4)
    first = '[{"name": "f", "arguments": {"a": "'
    value = writer(first)
    assert value is None or isinstance(value, str)
    length = writer._cache.get_seq_length()
    writer(writer._seen + 'x", "b": "')  # the answer went on: only the new text is run
    assert len(forks) == 1 and writer._cache.get_seq_length() > length
    writer('[{"name": "g", "arguments": {"a": "')  # text taken back: start again from the prompt
    assert len(forks) == 2
    assert prompt.cache.get_seq_length() == len(backend.encode("the prompt"))  # the prompt's state is never extended


@pytest.mark.parametrize("content, piece, end", [("", 'ab"c', 2), ("a\\", '"', None), ("a\\\\", '"x', 0),
                                                 ("", '\\"', None), ("", "abc", None)])
def test_closing_quote_skips_escaped_quotes(content: str, piece: str, end: int | None) -> None:
    assert _closing_quote(content, piece) == end


def test_cascade_writes_values_with_the_large_model_unless_switched_off() -> None:
    from hyfunc.formats.schema import parse_tools
    from hyfunc.methods.cascade import CascadeOptions
    from tests.serve_app import tiny_cascade
    from tests.test_serve_sdk import TOOLS as SERVE_TOOLS

    cascade = tiny_cascade()
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    tools = parse_tools(SERVE_TOOLS)
    answer = cascade.answer(messages, tools)
    assert "large_values" in answer.timings and "large_values" in answer.details
    plain = cascade.variant(CascadeOptions(large_values=False), "no-large-values").answer(messages, tools)
    assert "large_values" not in plain.timings
