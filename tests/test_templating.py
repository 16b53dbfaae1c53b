"""Dynamic templating decoder: always schema-valid output, model-chosen structure, exact targets."""
from __future__ import annotations

import json
import math

import pytest
import torch

from hyfunc.cascade.templating import TemplateDecoder, TemplateError, render_target, target_token_mask
from hyfunc.cascade.templating.drafting import mention_order
from hyfunc.cascade.templating.vocab import _string_piece_kind
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors
from tests.tiny_models import tiny_backend

TOOLS = parse_tools([
    {
        "name": "get weather.now",
        "description": "weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "temp": {"type": "number"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "flag": {"type": "boolean"},
            "level": {"type": "integer", "enum": [1, 10, 100]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "nums": {"type": "array", "items": {"type": "integer"}},
            "opt": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
                    "required": ["a"]},
            "maybe": {"type": "string", "default": None},
        }, "required": ["city", "days"]},
    },
    {"name": "get", "description": "no arguments", "parameters": {"type": "object", "properties": {}}},
    {
        "name": "math.free_form",
        "parameters": {"type": "object", "properties": {
            "free": {"type": "object"},
            "anything": {"type": "any"},
            "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            "mode": {"type": "string", "enum": ["a", "ab"]},
        }, "required": ["grid"]},
    },
])

GOLD_CASES = [
    [],
    [Call("get", {})],
    [Call("get weather.now", {"tags": ["a", "b"], "city": 'Paris "x" \\ y', "days": -3, "temp": 0.0015,
                              "unit": "celsius", "flag": True, "level": 10, "nums": [], "opt": {"b": 2, "a": "q"},
                              "maybe": None}),
     Call("get", {})],
    [Call("get weather.now", {"city": "", "days": 0, "level": 1, "nums": [7, -12], "maybe": "x"}),
     Call("get weather.now", {"city": "Rome", "days": 12, "temp": -2.5e-07, "level": 100, "flag": False})],
    [Call("math.free_form", {"grid": [[1, 2.5], []], "free": {"k": [1, "v"], "z": None}, "anything": True,
                             "mode": "a"})],
    [Call("math.free_form", {"grid": [], "free": {}, "anything": {"x": 1}, "mode": "ab"})],
]


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


@pytest.fixture(scope="module")
def decoder(backend):
    return TemplateDecoder(backend, max_calls=3, max_string_tokens=6, max_array_items=3)


class Wrapped:
    """The tiny backend with its logits rewritten by `fn(logits, position_after_prompt)`."""

    def __init__(self, backend, fn):
        self.inner, self.fn = backend, fn
        self.tokenizer = backend.tokenizer
        self.prompt_len = 0

    def encode(self, text):
        return self.inner.encode(text)

    def decode(self, ids):
        return self.inner.decode(ids)

    def start(self, prompt: str):
        ids = self.inner.encode(prompt)
        out = self.inner.forward(ids=ids)
        self.prompt_len = len(ids)
        out.logits = self.fn(out.logits.clone(), 0)
        return out

    def forward(self, ids=None, embeds=None, cache=None, logits_to_keep=1):
        out = self.inner.forward(ids=ids, embeds=embeds, cache=cache, logits_to_keep=logits_to_keep)
        # Positions from the cache: drafted tokens the decoder rejects are cropped from it.
        end = out.cache.get_seq_length() - self.prompt_len
        if out.tail_logits is not None:
            k = out.tail_logits.shape[0]
            out.tail_logits = torch.stack([self.fn(row.clone(), end - k + 1 + r) for r, row in enumerate(out.tail_logits)])
        out.logits = self.fn(out.logits.clone(), end)
        return out


def ids_of(backend, text):
    return [i for i in range(len(backend.tokenizer)) if backend.decode([i]) == text]


def check_output(backend, out, tools):
    names = {t.name for t in tools}
    data = json.loads(out.text)
    assert data == [{"name": c.name, "arguments": c.arguments} for c in out.calls]
    for c in out.calls:
        assert all(math.isfinite(x) for x in _leaves(c.arguments) if isinstance(x, float))
    for c in out.calls:
        assert c.name in names
        assert argument_errors(c, tools) == [], (c, out.text)
    assert out.generated_tokens + out.injected_tokens == len(out.token_ids)
    assert backend.decode(out.token_ids) == out.text
    # the decoder writes keys in the order render_target uses (numbers may be spelled differently)
    assert json.loads(render_target(out.calls, tools)) == data
    assert [list(_keys(c.arguments)) for c in out.calls] == [
        list(_keys(d["arguments"])) for d in json.loads(render_target(out.calls, tools))
    ]


def _leaves(v):
    """The scalar values inside a JSON value (strings, numbers, booleans, null), depth first."""
    if isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def _keys(v, prefix=""):
    if isinstance(v, dict):
        for k, x in v.items():
            yield prefix + k
            yield from _keys(x, prefix + k + ".")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _keys(x, f"{prefix}{i}.")


def test_string_piece_kinds():
    assert _string_piece_kind("abc", 0) == 0
    assert _string_piece_kind('ab"', 0) == 2
    assert _string_piece_kind('"', 0) == 2
    assert _string_piece_kind("a\\", 0) == 1  # open escape
    assert _string_piece_kind("a\\\\", 0) == 0
    assert _string_piece_kind('"', 1) == 0  # \" is content
    assert _string_piece_kind('n"', 1) == 2
    assert _string_piece_kind("x", 1) is None
    assert _string_piece_kind("a\nb", 0) is None
    assert _string_piece_kind('a"b', 0) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_real_tiny_model_outputs_are_valid(seed):
    backend = tiny_backend(seed=seed)
    dec = TemplateDecoder(backend, max_calls=3, max_string_tokens=6, max_array_items=3)
    for tools in (TOOLS, TOOLS[:1], TOOLS[2:]):
        step = backend.forward(ids=backend.encode("What is the weather like in Paris today?"))
        check_output(backend, dec.decode(step, tools), tools)


def test_empty_tool_list_gives_no_call(backend, decoder):
    step = backend.forward(ids=backend.encode("hello"))
    out = decoder.decode(step, [])
    assert out.text == "[]" and out.calls == [] and out.generated_tokens == 0 and out.forward_calls == 0


def test_random_logits_always_valid_and_cover_choices(backend, decoder):
    seen = {"no_call": 0, "parallel": 0, "optional": 0, "items": 0, "text": 0, "null": 0, "tools": set()}
    for seed in range(16):
        g = torch.Generator().manual_seed(seed)
        w = Wrapped(backend, lambda l, pos, g=g: torch.randn(l.shape[0], generator=g) * 4)
        dec = TemplateDecoder(w, max_calls=3, max_string_tokens=6, max_array_items=3)
        tools = TOOLS if seed % 3 else TOOLS[2:] + TOOLS[:1]
        out = dec.decode(w.start("What is the weather?"), tools)
        check_output(backend, out, tools)
        assert out.forward_calls < len(out.token_ids)  # forced tokens are batched
        seen["no_call"] += not out.calls
        seen["parallel"] += len(out.calls) > 1
        for c in out.calls:
            seen["tools"].add(c.name)
            tool = next(t for t in tools if t.name == c.name)
            seen["optional"] += any(k in c.arguments for k in tool.optional)
            seen["items"] += any(isinstance(v, list) and v for v in c.arguments.values())
            seen["text"] += any(isinstance(v, str) and v for v in c.arguments.values())
            seen["null"] += c.arguments.get("maybe", 0) is None
    assert seen["no_call"] and seen["parallel"] and seen["optional"] and seen["items"] and seen["text"]
    assert seen["tools"] == {t.name for t in TOOLS}


def test_forbidden_tokens_cannot_break_structure(backend, decoder):
    bad = list(backend.eos_ids) + ids_of(backend, "\n") + ids_of(backend, "}") + ids_of(backend, '"')
    w = Wrapped(backend, lambda l, pos: l.index_fill(0, torch.tensor(bad), math.inf))
    dec = TemplateDecoder(w, max_calls=3, max_string_tokens=6, max_array_items=3)
    for tools in (TOOLS, TOOLS[2:]):
        out = dec.decode(w.start("x"), tools)
        check_output(backend, out, tools)


def test_comma_bias_gives_parallel_calls_and_all_optional_keys(backend):
    comma, brace = ids_of(backend, ","), ids_of(backend, "{")
    assert comma and brace

    def bias(logits, pos):  # '{' starts a call rather than '[]'; ',' beats everything
        return logits.index_fill(0, torch.tensor(brace), 50.0).index_fill(0, torch.tensor(comma), math.inf)

    w = Wrapped(backend, bias)
    dec = TemplateDecoder(w, max_calls=3, max_string_tokens=4, max_array_items=2, stop_on_repeat=False)
    tools = TOOLS[:1]  # has a required key, so each optional key is offered as ', "key": '
    out = dec.decode(w.start("What is the weather?"), tools)
    check_output(backend, out, tools)
    assert len(out.calls) == 3  # ',' after every call, up to max_calls
    for c in out.calls:
        keys = list(c.arguments)
        schema = list(tools[0].parameters)
        assert keys == [k for k in schema if k in keys]  # schema order
        # ', "key": ' always beats '}', so the choice loop only ends when no optional key is left
        assert keys[-1] == schema[-1] == "maybe"
        if "opt" in c.arguments:
            assert set(c.arguments["opt"]) == {"a", "b"}
        assert ids_of(backend, str(c.arguments["days"]))  # "," ends a number right after its first token
        for key in ("tags", "nums"):
            assert len(c.arguments.get(key, [])) in (0, 2)  # once started, ',' continues up to the cap
        assert c.arguments["city"] == ",,,,"  # ',' is string content up to the cap, then closed


def test_name_prefix_completion_is_injected(backend):
    # Force the first generated token to be '{' then 'get': the name is ambiguous ("get" vs
    # "get weather.now") until the model picks '"' or ' weather'; "math.free_form" is excluded.
    quote = ids_of(backend, '"')
    w = Wrapped(backend, lambda l, pos: l.index_fill(0, torch.tensor(quote), math.inf))
    dec = TemplateDecoder(w, max_calls=1)
    out = dec.decode(w.start("x"), TOOLS)
    check_output(backend, out, TOOLS)


@pytest.mark.parametrize("case", range(len(GOLD_CASES)))
def test_teacher_forcing_reproduces_gold(backend, case):
    gold = GOLD_CASES[case]
    text = render_target(gold, TOOLS)
    assert json.loads(text) == [{"name": c.name, "arguments": c.arguments} for c in gold]
    ids, mask = target_token_mask(backend, gold, TOOLS)
    assert backend.decode(ids) == text and len(mask) == len(ids)
    if gold:
        assert 0 < sum(mask) < len(ids)  # boilerplate is injected, choices and values are trained

    def forced(logits, pos):
        out = torch.full_like(logits, -1e4)
        if pos < len(ids):
            out[ids[pos]] = 10.0
        return out

    w = Wrapped(backend, forced)
    dec = TemplateDecoder(w, max_calls=4)
    out = dec.decode(w.start("prompt"), TOOLS)
    assert out.text == text
    assert out.token_ids == ids
    assert [(c.name, c.arguments) for c in out.calls] == [(c.name, c.arguments) for c in gold]
    check_output(backend, out, TOOLS)
    # every token the decoder generated carries the training loss
    generated = _generated_positions(dec, gold)
    assert all(mask[i] for i in generated)


def _generated_positions(dec, gold):
    _, generated, _ = dec.target(gold, TOOLS)
    return [i for i, g in enumerate(generated) if g]


def test_render_target_orders_required_first():
    call = Call("get weather.now", {"maybe": "m", "opt": {"b": 1, "a": "x"}, "days": 2, "city": "c"})
    assert render_target([call], TOOLS) == (
        '[{"name": "get weather.now", "arguments": {"city": "c", "days": 2, "opt": {"a": "x", "b": 1}, '
        '"maybe": "m"}}]'
    )
    assert render_target([], TOOLS) == "[]"


def test_invalid_gold_is_rejected(backend):
    with pytest.raises(TemplateError):
        target_token_mask(backend, [Call("nope", {})], TOOLS)
    with pytest.raises(TemplateError):
        target_token_mask(backend, [Call("get weather.now", {"city": "x"})], TOOLS)  # days missing
    with pytest.raises(TemplateError):
        target_token_mask(backend, [Call("get weather.now", {"city": "x", "days": 1, "unit": "kelvin"})], TOOLS)
    with pytest.raises(TemplateError):
        target_token_mask(backend, [Call("get", {"extra": 1})], TOOLS)


def test_required_call_overrides_a_model_that_prefers_no_call(backend):
    close = ids_of(backend, "]")
    assert close
    w = Wrapped(backend, lambda l, pos: l.index_fill(0, torch.tensor(close), math.inf))  # ']' beats everything
    dec = TemplateDecoder(w, max_calls=3, max_string_tokens=4, max_array_items=2)
    assert dec.decode(w.start("What is the weather?"), TOOLS).calls == []
    out = dec.decode(w.start("What is the weather?"), TOOLS, require_call=True)
    check_output(backend, out, TOOLS)
    assert len(out.calls) == 1  # and then ']' ends the list
    assert dec.decode(w.start("x"), [], require_call=True).text == "[]"  # nothing offered: nothing to call


def test_drafts_save_passes_without_changing_the_output():
    backend = tiny_backend(seed=1)
    kw = dict(max_calls=3, max_string_tokens=12, max_array_items=3)
    prompt = backend.encode("What is the weather like in Paris today?")
    plain = TemplateDecoder(backend, max_draft_tokens=0, **kw).decode(backend.forward(ids=prompt), TOOLS)
    assert plain.drafted_tokens == 0
    dec = TemplateDecoder(backend, max_draft_tokens=16, **kw)
    # Choices drafted from guesses (the first tool, "}" for optional keys), no source text.
    guessed = dec.decode(backend.forward(ids=prompt), TOOLS)
    assert guessed.text == plain.text and guessed.token_ids == plain.token_ids
    assert guessed.forward_calls <= plain.forward_calls
    # A source holding the values the model writes anyway: its drafts are the model's own choices.
    # As a request would mention them: strings quoted, numbers spelled in JSON.
    values = [x for c in plain.calls for x in _leaves(c.arguments) if x is not None and not isinstance(x, bool)]
    source = " and ".join(f"'{x}'" if isinstance(x, str) else json.dumps(x) for x in values)
    assert len(source) > 20
    copied = dec.decode(backend.forward(ids=prompt), TOOLS, draft_source=source)
    assert copied.text == plain.text and copied.token_ids == plain.token_ids
    assert copied.generated_tokens == plain.generated_tokens
    assert 0 < copied.accepted_draft_tokens <= copied.drafted_tokens
    assert copied.forward_calls < guessed.forward_calls
    # Drafts the model disagrees with cost nothing in the output either (rejected, cropped).
    wrong = dec.decode(backend.forward(ids=prompt), TOOLS, draft_source=source[::-1] + source.upper())
    assert wrong.text == plain.text and wrong.token_ids == plain.token_ids
    check_output(backend, copied, TOOLS)


def test_mention_order_follows_the_request():
    tools = parse_tools([
        {"name": "getMobileScreenSize", "parameters": {"type": "object", "properties": {}}},
        {"name": "getMobileColorScheme", "parameters": {"type": "object", "properties": {}}},
        {"name": "addTrackToPlaylist", "parameters": {"type": "object", "properties": {}}},
    ])
    request = "Additionally, check the colors on iOS, then the screen size of my mobile, and add a track."
    # "color(s)" before "screen"; "mobile" and "get" are shared and say nothing; "add" is a word, not "Additionally".
    assert mention_order(tools, request) == [1, 0, 2]
    assert mention_order(tools, "nothing relevant") == [0, 1, 2]  # unmentioned: by rank


def test_guessed_drafts_write_a_whole_call_list_in_a_few_passes(backend):
    tools = parse_tools([
        {"name": "weather.get_city", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}},
        {"name": "weather.set_days", "parameters": {"type": "object", "properties": {
            "days": {"type": "integer"}}, "required": ["days"]}},
    ])
    gold = [Call("weather.set_days", {"days": 12}), Call("weather.get_city", {"city": "New York"})]
    source = "Set the days to 12, then get the city 'New York'."
    ids, _ = target_token_mask(backend, gold, tools)

    def forced(logits, pos):  # a model that writes exactly the gold calls
        out = torch.full_like(logits, -1e4)
        if pos < len(ids):
            out[ids[pos]] = 10.0
        return out

    w = Wrapped(backend, forced)
    plain = TemplateDecoder(w, max_draft_tokens=0).decode(w.start("p"), tools, draft_source=source)
    drafted = TemplateDecoder(w, max_draft_tokens=64).decode(w.start("p"), tools, draft_source=source)
    assert drafted.text == plain.text == render_target(gold, tools)
    assert drafted.token_ids == plain.token_ids == ids
    # "[" with the guessed opening of set_days up to its value; "1" with "2", the end of the call
    # and the opening of get_city; "New" with " York", the quote and the end: three passes.
    assert drafted.forward_calls == 3 < plain.forward_calls


def test_a_call_repeated_word_for_word_is_taken_back_and_the_list_closed(backend):
    comma = ids_of(backend, ",")

    def bias(logits, pos):  # ',' beats everything: another call after each, values cut short alike
        return logits.index_fill(0, torch.tensor(comma), math.inf)

    tools = TOOLS[1:2]  # "get", no arguments: every call is the same text
    looping = TemplateDecoder(Wrapped(backend, bias), max_calls=4, stop_on_repeat=False)
    looped = looping.backend.start("Get it.")
    out = looping.decode(looped, tools, require_call=True)
    assert [c.name for c in out.calls] == ["get"] * 4  # without the guard: repeats up to the cap
    w = Wrapped(backend, bias)
    guarded = TemplateDecoder(w, max_calls=4)
    step = w.start("Get it.")
    out = guarded.decode(step, tools, require_call=True)
    check_output(backend, out, tools)
    assert out.text == '[{"name": "get", "arguments": {}}]'
    # The first call and the separator were run through the model to choose what follows; taking
    # back returns the KV cache (extended in place) to where it stood before the separator, when
    # the first call was still waiting to be fed: the prompt alone.
    prompt_len = len(backend.encode("Get it."))
    assert step.cache.get_seq_length() == prompt_len
    assert looped.cache.get_seq_length() > prompt_len + len(out.token_ids)


def test_an_array_item_repeating_an_earlier_one_is_taken_back_and_the_array_closed(backend):
    comma = ids_of(backend, ",")

    def bias(logits, pos):  # ',' beats everything: every item is the same run of commas, another always follows
        return logits.index_fill(0, torch.tensor(comma), math.inf)

    tools = parse_tools([{"name": "tag", "parameters": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}},
        "counts": {"type": "array", "items": {"type": "integer"}}}, "required": ["tags"]}}])
    looping = TemplateDecoder(Wrapped(backend, bias), max_calls=1, max_string_tokens=3, max_array_items=5,
                              stop_on_repeat=False)
    out = looping.decode(looping.backend.start("Tag it."), tools, require_call=True)
    assert len(out.calls[0].arguments["tags"]) == 5  # without the guard: repeats up to the cap
    guarded = TemplateDecoder(Wrapped(backend, bias), max_calls=1, max_string_tokens=3, max_array_items=5)
    out = guarded.decode(guarded.backend.start("Tag it."), tools, require_call=True)
    check_output(backend, out, tools)
    arguments = out.calls[0].arguments
    assert arguments["tags"] == [",,,"]  # the second ",,," was taken back and the array closed
    assert len(arguments["counts"]) == 5  # numbers may repeat on purpose: no guard, up to the cap
    assert out.text == json.dumps([{"name": "tag", "arguments": arguments}])


FLOAT_TOOLS = parse_tools([{  # a BFCL doc: "float" is a Python float, "number" stays JSON's
    "name": "area", "parameters": {"type": "dict", "properties": {
        "width": {"type": "float"}, "bounds": {"type": "array", "items": {"type": "float"}},
        "scale": {"type": "number"},
    }, "required": ["width", "bounds", "scale"]},
}])


def test_declared_floats_are_written_as_floats(backend):
    gold = [Call("area", {"width": 2, "bounds": [1, 3.5], "scale": 2})]
    assert render_target(gold, FLOAT_TOOLS) == (
        '[{"name": "area", "arguments": {"width": 2.0, "bounds": [1.0, 3.5], "scale": 2}}]'
    )
    ids, _ = target_token_mask(backend, gold, FLOAT_TOOLS)  # training targets: the same text
    assert backend.decode(ids) == render_target(gold, FLOAT_TOOLS)
    written = integral = 0
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        w = Wrapped(backend, lambda l, pos, g=g: torch.randn(l.shape[0], generator=g) * 4)
        out = TemplateDecoder(w, max_calls=2, max_array_items=3).decode(w.start("area?"), FLOAT_TOOLS)
        check_output(backend, out, FLOAT_TOOLS)
        for c in out.calls:
            floats = [c.arguments["width"], *c.arguments["bounds"]]
            assert all(type(x) is float for x in floats), out.text
            written += len(floats)
            integral += sum(x.is_integer() for x in floats)
    assert written and integral  # integral values occurred, and came out as floats
