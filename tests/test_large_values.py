"""Scalar values written by the large model (cascade/large_values.py): the decoder injects what
the writer writes (strings, enum members, numbers) and writes the rest itself, the writer follows
the answer text incrementally, decodes multi-byte characters whole, and the cascade's switches work."""
from __future__ import annotations

import json

import pytest
import torch

from hyfunc.cascade.large_values import LargeValueWriter, _number_value, _string_end
from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.formats.grounding import listed_item
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors
from tests.test_templating import TOOLS
from tests.tiny_models import tiny_backend


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


class Recording:
    """A ValueWriter that writes fixed values and records what it was asked."""

    model_drafts = False

    def __init__(self, string=None, choice=None, number=None):
        self._string, self._choice, self._number = string, choice, number
        self.asked: list[tuple[str, str]] = []

    def string(self, text_so_far, draft=None, examples=()):
        self.asked.append(("string", text_so_far))
        return self._string

    def choice(self, text_so_far, options):
        self.asked.append(("choice", text_so_far))
        return options.index(self._choice) if self._choice in options else None

    def number(self, text_so_far, integer, draft=None):
        self.asked.append(("number", text_so_far))
        return None if self._number is None else self._number(integer)


def _decode(backend, writer=None, tools=TOOLS[:1]):
    step = backend.forward(ids=backend.encode("weather please"))
    decoder = TemplateDecoder(backend, max_calls=2, max_string_tokens=6, max_array_items=2)
    return decoder.decode(step, tools, require_call=True, write_value=writer)


def test_decoder_injects_the_written_strings_and_keeps_the_rest(backend) -> None:
    writer = Recording(string='Boston, "MA"')
    out = _decode(backend, writer)
    calls = json.loads(out.text)
    assert calls and all(c["arguments"]["city"] == 'Boston, "MA"' for c in calls)
    assert all(not argument_errors(c, TOOLS) for c in out.calls)
    assert writer.asked[0] == ("string", writer.asked[0][1]) and writer.asked[0][1].endswith('"city": "')


SCALARS = parse_tools([{"name": "convert", "parameters": {"type": "object", "properties": {
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "level": {"type": "integer", "enum": [1, 10]},
    "days": {"type": "integer"}, "temp": {"type": "number"}, "nums": {"type": "array", "items": {"type": "integer"}},
}, "required": ["unit", "level", "days", "temp", "nums"]}}])


def test_decoder_injects_chosen_members_and_written_numbers(backend) -> None:
    writer = Recording(choice='"fahrenheit"', number=lambda integer: "-7" if integer else "2.5")
    out = _decode(backend, writer, SCALARS)
    for call in json.loads(out.text):
        args = call["arguments"]
        assert (args["unit"], args["days"], args["temp"]) == ("fahrenheit", -7, 2.5)
        assert args["level"] in (1, 10)  # the writer declined: the small model chose
        assert all(n == -7 for n in args["nums"])  # typed array items are values too
    assert all(not argument_errors(c, SCALARS) for c in out.calls)
    asked = [kind for kind, _ in writer.asked]
    assert asked[:4] == ["choice", "choice", "number", "number"]  # unit, level, days, temp: in schema order
    assert writer.asked[0][1].endswith('"unit": ')  # an enum member starts with its quote: not injected before


def test_decoder_writes_itself_when_the_writer_declines(backend) -> None:
    mine = _decode(backend)
    declined = _decode(backend, Recording())
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
    value = writer.string(first)
    assert value is None or isinstance(value, str)
    length = writer._cache.get_seq_length()
    writer.string(writer._seen + 'x", "b": "')  # the answer went on: only the new text is run
    assert len(forks) == 1 and writer._cache.get_seq_length() > length
    writer.string('[{"name": "g", "arguments": {"a": "')  # text taken back: start again from the prompt
    assert len(forks) == 2
    assert prompt.cache.get_seq_length() == len(backend.encode("the prompt"))  # the prompt's state is never extended


class Scripted:
    """The tiny backend, made to generate `script`'s tokens in order (greedy picks them)."""

    def __init__(self, backend, script: list[int]):
        self.backend, self.script = backend, list(script)

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def _next(self, step):
        logits = torch.full_like(step.logits, -1e4)
        if self.script:
            logits[self.script.pop(0)] = 0.0
        step.logits = logits
        return step

    def forward(self, **kwargs):
        return self._next(self.backend.forward(**kwargs))


def _scripted_writer(backend, script: str, kinds=("string",)) -> LargeValueWriter:
    """A writer whose large model will write `script` (from its next pass on)."""
    scripted = Scripted(backend, [])
    prompt = scripted.forward(ids=backend.encode("the prompt"))
    scripted.script = backend.encode(script)
    return LargeValueWriter(scripted, prompt, kinds=kinds)


def test_multibyte_characters_split_over_tokens_come_out_whole(backend) -> None:
    assert any("\ufffd" in backend.decode([t]) for t in backend.encode("广东"))  # byte tokens: one alone is no character
    writer = _scripted_writer(backend, '广东", ')
    text = '[{"name": "f", "arguments": {"a": "'
    assert writer.string(text) == "广东"
    assert writer._seen == text + "广东"  # the closing quote's token is left to the template


def test_number_writing_stops_at_the_first_other_character(backend) -> None:
    text = '[{"name": "f", "arguments": {"n": '
    # Written after `": ` without its space, then with it, as the tokenizer spells " -12".
    writer = _scripted_writer(backend, " -12, ", kinds=("number",))
    assert writer.number(text, integer=True) == "-12" and writer._seen == text + "-12"
    assert _scripted_writer(backend, " 2.5}", kinds=("number",)).number(text, integer=True) is None  # not an integer
    assert _scripted_writer(backend, " 2.5}", kinds=("number",)).number(text, integer=False) == "2.5"
    assert _scripted_writer(backend, '"x"', kinds=("number",)).string(text) is None  # strings are not among its kinds


@pytest.mark.parametrize("number, request_text, value", [
    ("510", "Find the factorial of 5,10 and 15.", "5"), ("15", "for 1,5 and 10 years", "1"),
    ("1510", "ids 1,5,10", "1"), ("5", "Find the factorial of 5,10 and 15.", "5"),
    ("1000", "invest $1,000 now", "1000"), ("1000500", "1,000,500 people", "1000500"),  # thousands separators
    ("510", "5 and 10", "510"), ("510", "", "510"), ("314", "3.14,15", "314"),
])
def test_a_number_joining_a_listed_pair_is_the_lists_first_item(number: str, request_text: str, value: str) -> None:
    assert listed_item(number, request_text) == value


def test_the_writers_number_is_read_against_the_requests_lists(backend) -> None:
    text = '[{"name": "f", "arguments": {"n": '
    writer = _scripted_writer(backend, " 510}", kinds=("number",))
    writer.request = "Find the factorial of 5,10 and 15."
    assert writer.number(text, integer=True) == "5"
    assert _scripted_writer(backend, " 510}", kinds=("number",)).number(text, integer=True) == "510"  # no request


@pytest.mark.parametrize("script, examples, value", [
    ('San Francisco", CA"', ("City, State", "San Francisco, CA"), "San Francisco, CA"),  # goes on from the separator: " CA"
    ('San Francisco", CA"', (), "San Francisco"),  # no described form
    ('San Francisco", CA"', ("Twitter, Facebook, Instagram",), "San Francisco"),  # a form of three parts may be a list
    ('Boston, MA", x"', ("City, State",), "Boston, MA"),  # in the form already
    ('San Francisco", 1, 2"', ("City, State",), "San Francisco"),  # what follows the separator leaves the form
    ('2023-10-1 to 2023-10-7"', ("YYYY-MM-DD to YYYY-MM-DD",), "2023-10-01 to 2023-10-07"),
])
def test_a_string_is_brought_into_its_described_form(backend, script: str, examples, value: str) -> None:
    text = '[{"name": "f", "arguments": {"location": "'
    writer = _scripted_writer(backend, script)
    assert writer.string(text, examples=examples) == value
    writer = _scripted_writer(backend, script)
    writer.described_forms = False
    assert writer.string(text, examples=examples) == script.split('"')[0]


@pytest.mark.parametrize("text, integer, value", [("12", True, "12"), ("-0.5", False, "-0.5"), ("1e3", False, "1e3"),
                                                  ("2.0", True, None), ("05", False, None), ("-", False, None),
                                                  ("", True, None), ("1.", False, None)])
def test_number_values_must_be_json_numbers_of_the_type(text: str, integer: bool, value: str | None) -> None:
    assert _number_value(text, integer) == value


def test_choice_is_the_likeliest_member_and_leaves_the_state_as_it_was(backend) -> None:
    prompt = backend.forward(ids=backend.encode("the prompt"))
    writer = LargeValueWriter(backend, prompt, kinds=("choice",))
    text = '[{"name": "f", "arguments": {"unit": '
    options = ['"celsius"', '"fahrenheit"', '"kelvin"']
    chosen = writer.choice(text, options)
    length = writer._cache.get_seq_length()

    def score(option: str) -> float:  # the log-probability of " " + option after the text's head, from a fresh pass
        tail = backend.encode(" " + option)
        ids = backend.encode(text[:-1]) + tail
        step = backend.forward(ids=ids, cache=backend.fork(prompt.cache), logits_to_keep=len(ids))
        logp = torch.log_softmax(torch.cat([prompt.logits[None], step.tail_logits[:-1]]).float(), -1)
        return float(sum(logp[len(ids) - len(tail) + i, tid] for i, tid in enumerate(tail)))

    scores = [score(o) for o in options]
    assert chosen == max(range(3), key=scores.__getitem__)
    assert writer.choice(text, options) == chosen and writer._cache.get_seq_length() == length  # scored, then cropped
    assert writer.choice(text, ['"only"']) is None  # nothing to choose


@pytest.mark.parametrize("text, end", [('ab"c', 2), ('a\\"', None), ('a\\\\"x', 3), ('\\"', None), ("abc", None)])
def test_string_end_skips_escaped_quotes(text: str, end: int | None) -> None:
    assert _string_end(text) == end


def test_unknown_kinds_are_refused(backend) -> None:
    prompt = backend.forward(ids=backend.encode("the prompt"))
    with pytest.raises(ValueError, match="unknown value kinds"):
        LargeValueWriter(backend, prompt, kinds=("string", "boolean"))


class Knowing:
    """The tiny backend made to write `script` from cache position `start` on, whatever it is fed
    there: the logits after position p pick script[p - start] (the end of text after it). Drafts
    that copy the script are its own greedy choices; others are not."""

    def __init__(self, backend, script: str):
        self.backend, self.script, self.start, self.passes = backend, backend.encode(script), 0, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def forward(self, ids=None, embeds=None, cache=None, logits_to_keep=1, output_hidden=False):
        self.passes += 1
        step = self.backend.forward(ids=ids, embeds=embeds, cache=cache, logits_to_keep=logits_to_keep)
        rows = step.tail_logits if logits_to_keep > 1 else step.logits[None]
        first = step.cache.get_seq_length() - len(rows) + 1  # the cache length after the first row's token
        picked = torch.full_like(rows, -1e4)
        for i in range(len(rows)):
            at = first + i - self.start
            picked[i, self.script[at] if 0 <= at < len(self.script) else next(iter(self.backend.eos_ids))] = 0.0
        step.logits, step.tail_logits = picked[-1], picked if logits_to_keep > 1 else None
        return step


@pytest.mark.parametrize("kind, request_text, script, value", [
    ("string", "is it raining in San Francisco today?", 'San Francisco today", ', "San Francisco today"),
    ("string", "is it raining in San Diego today?", 'San Francisco today", ', "San Francisco today"),  # draft wrong from "San " on
    ("number", "order 12345 units", " 12345, ", "12345"),
])
def test_drafts_from_the_request_write_the_same_value_in_fewer_passes(backend, kind, request_text, script, value) -> None:
    text = '[{"name": "f", "arguments": {"a": ' + ('"' if kind == "string" else "")
    results = {}
    # no drafts; copy drafts from the request; the decoding model's value as the first draft (right, then wrong)
    for source, model_value in (("", None), (request_text, None), ("", value), ("", "12" if kind == "number" else "San Fran")):
        knowing = Knowing(backend, script)
        prompt = knowing.forward(ids=backend.encode("the prompt"))
        head = text.rstrip(" ")  # a number is written with the space before it (`_split_gap`)
        knowing.start = prompt.cache.get_seq_length() + len(backend.encode(head))
        writer = LargeValueWriter(knowing, prompt, kinds=(kind,), draft_source=source, model_drafts=model_value is not None)
        knowing.passes = 0
        written = writer.string(text, model_value) if kind == "string" else writer.number(text, True, model_value)
        results[source, model_value] = (written, writer._seen, writer._cache.get_seq_length(), knowing.passes, writer.drafted)
    plain = results["", None]
    assert plain[4] == 0
    for (source, model_value), result in results.items():
        assert result[:3] == plain[:3] == (value, text.rstrip(" ") + script.split('"')[0].split(",")[0], plain[2])
        if model_value == value:
            assert result[3] == 1  # one pass: the text before the value and the whole value
        elif source and ("Francisco" in request_text or kind == "number"):
            assert 0 < result[4] and result[3] < plain[3]  # a right copy draft saves passes


class Checking:
    """A ValueWriter with model drafts: agrees with the model's strings and numbers (returns the
    draft) or writes its own, and records the drafts it was given."""

    model_drafts = True

    def __init__(self, agree: bool):
        self.agree, self.drafts = agree, []

    def string(self, text_so_far, draft=None, examples=()):
        self.drafts.append(("string", text_so_far, draft))
        return json.loads('"' + draft + '"') if self.agree else "Boston, MA"

    def choice(self, text_so_far, options):
        return None

    def number(self, text_so_far, integer, draft=None):
        self.drafts.append(("number", text_so_far, draft))
        return draft if self.agree else "7"


@pytest.mark.parametrize("agree", [True, False])
def test_the_models_value_is_the_writers_draft_and_stands_only_where_the_writer_agrees(backend, agree) -> None:
    tools = parse_tools([{"name": "book", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "seats": {"type": "integer"}}, "required": ["city", "seats"]}}])
    plain = _decode(backend, None, tools)  # the model alone
    pieces: list[str] = []
    step = backend.forward(ids=backend.encode("weather please"))
    decoder = TemplateDecoder(backend, max_calls=2, max_string_tokens=6, max_array_items=2)
    writer = Checking(agree)
    out = decoder.decode(step, tools, require_call=True, write_value=writer, on_text=pieces.append)
    assert "".join(pieces) == out.text  # text taken back was never streamed
    first = plain.calls[0].arguments
    assert writer.drafts[0] == ("string", writer.drafts[0][1], json.dumps(first["city"], ensure_ascii=False)[1:-1])
    assert writer.drafts[0][1].endswith('"city": "') and writer.drafts[1][1].endswith('"seats": ')
    if agree:
        assert writer.drafts[1][2] == str(first["seats"])
        assert out.text == plain.text and out.rewinds == plain.rewinds
    else:  # the number is written after the writer's city: the model's draft of it may differ from `plain`'s
        assert all(c.arguments == {"city": "Boston, MA", "seats": 7} for c in out.calls)


def test_cascade_writes_values_with_the_large_model_unless_switched_off() -> None:
    from hyfunc.methods.cascade import CascadeOptions
    from tests.serve_app import tiny_cascade
    from tests.test_serve_sdk import TOOLS as SERVE_TOOLS

    cascade = tiny_cascade()
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    tools = parse_tools(SERVE_TOOLS)
    answer = cascade.answer(messages, tools)
    assert "large_values" in answer.timings and "large_values" in answer.details
    off = CascadeOptions(large_values=False, large_choices=False, large_numbers=False)
    plain = cascade.variant(off, "no-large-values").answer(messages, tools)
    assert "large_values" not in plain.timings
    assert CascadeOptions(large_choices=False).large_value_kinds() == ("string", "number")


def test_value_drafts_change_the_passes_not_the_answers() -> None:
    from hyfunc.methods.cascade import CascadeOptions
    from tests.serve_app import tiny_cascade
    from tests.test_serve_sdk import TOOLS as SERVE_TOOLS

    cascade = tiny_cascade()
    undrafted = cascade.variant(CascadeOptions.without("value_drafts"), "no-value-drafts")
    tools = parse_tools(SERVE_TOOLS)
    for request in ("What is the weather like in Paris today?", "Book a table for two at 7 pm in Paris."):
        messages = [{"role": "user", "content": request}]
        pieces: list[str] = []
        drafted, plain = cascade.answer(messages, tools, on_text=pieces.append), undrafted.answer(messages, tools)
        assert (drafted.calls, drafted.raw_text) == (plain.calls, plain.raw_text) and "".join(pieces) == drafted.raw_text
        if plain.details.get("large_values", {}).get("passes"):
            assert drafted.details["large_values"]["drafted"] > 0 and plain.details["large_values"]["drafted"] == 0
