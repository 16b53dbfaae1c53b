"""The templating decoder's `on_text` hook: pieces in order, final only, the whole output.

The repeat guard takes back a call (or array item) that repeats an earlier one word for word; a
streamed piece must never contain text it takes back, and the pieces must concatenate to the
output. Tiny random models, with their logits rewritten (`Wrapped`) to force loops."""
from __future__ import annotations

import json
import math

import torch

from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.formats.schema import parse_tools
from tests.test_templating import TOOLS, Wrapped, check_output, ids_of
from tests.tiny_models import tiny_backend


def _decode(dec: TemplateDecoder, prompt: str, tools, **kwargs) -> tuple[object, list[str]]:
    pieces: list[str] = []
    out = dec.decode(dec.backend.start(prompt), tools, on_text=pieces.append, **kwargs)
    return out, pieces


def _call_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each call object (depth-1 object) in a call-list text."""
    spans, depth, start, in_string, escape = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            escape, in_string = (False, True) if escape else (ch == "\\", ch != '"')
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth == 2 and ch == "{":
                start = i
        elif ch in "]}":
            if depth == 2 and ch == "}":
                spans.append((start, i + 1))
            depth -= 1
    return spans


def test_pieces_are_the_output_and_later_calls_wait_only_until_they_differ():
    backend = tiny_backend()
    inside_later_calls = 0
    for seed in range(24):
        g = torch.Generator().manual_seed(seed)
        fn = lambda l, pos, g=g: torch.randn(l.shape[0], generator=g) * 4  # noqa: E731
        tools = TOOLS if seed % 3 else TOOLS[1:2] + TOOLS[:1]
        out, pieces = _decode(TemplateDecoder(Wrapped(backend, fn), max_calls=4, max_string_tokens=6, max_array_items=3),
                              "What is the weather?", tools)
        check_output(backend, out, tools)
        assert "".join(pieces) == out.text and all(pieces)
        bounds = [sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))]
        spans = _call_spans(out.text)
        for k, (start, end) in enumerate(spans[1:], 1):
            earlier = [out.text[s:e] for s, e in spans[:k]]
            separator = spans[k - 1][1]
            for b in bounds:
                if separator < b < end:
                    # Published while the call was open: it already differed from every earlier call
                    # (else the guard might still have taken it back).
                    assert b > start and not any(e.startswith(out.text[start:b]) for e in earlier), (out.text, b)
                    inside_later_calls += 1
    assert inside_later_calls  # later calls do stream before they close


def test_same_output_with_and_without_the_hook():
    for seed in (0, 1, 2):
        backend = tiny_backend(seed=seed)
        dec = TemplateDecoder(backend, max_calls=3, max_string_tokens=6, max_array_items=3)
        for tools in (TOOLS, TOOLS[2:]):
            plain = dec.decode(backend.forward(ids=backend.encode("Weather in Paris and Rome?")), tools)
            pieces: list[str] = []
            streamed = dec.decode(backend.forward(ids=backend.encode("Weather in Paris and Rome?")), tools,
                                  on_text=pieces.append)
            assert streamed.text == plain.text == "".join(pieces) and streamed.token_ids == plain.token_ids


def test_a_repeated_call_is_never_streamed():
    backend = tiny_backend()
    comma = ids_of(backend, ",")

    def bias(logits, pos):  # ',' beats everything: another call after each, each the same
        return logits.index_fill(0, torch.tensor(comma), math.inf)

    out, pieces = _decode(TemplateDecoder(Wrapped(backend, bias), max_calls=4), "Get it.", TOOLS[1:2], require_call=True)
    assert out.rewinds == 1 and out.text == '[{"name": "get", "arguments": {}}]'
    assert "".join(pieces) == out.text
    # The first call was out before the second began (which was then taken back unseen).
    bounds = {len("".join(pieces[:i])) for i in range(1, len(pieces) + 1)}
    assert len('[{"name": "get", "arguments": {}}') in bounds


def test_a_repeated_array_item_is_never_streamed():
    backend = tiny_backend()
    comma = ids_of(backend, ",")

    def bias(logits, pos):
        return logits.index_fill(0, torch.tensor(comma), math.inf)

    tools = parse_tools([{"name": "tag", "parameters": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}},
        "counts": {"type": "array", "items": {"type": "integer"}}}, "required": ["tags"]}}])
    out, pieces = _decode(TemplateDecoder(Wrapped(backend, bias), max_calls=1, max_string_tokens=3, max_array_items=5),
                          "Tag it.", tools, require_call=True)
    assert out.rewinds == 1 and json.loads(out.text)[0]["arguments"]["tags"] == [",,,"]
    assert "".join(pieces) == out.text
    # The numbers after the taken-back item stream one by one: the guard holds nothing there.
    counts = out.text.index('"counts"')
    assert sum(1 for i in range(1, len(pieces)) if len("".join(pieces[:i])) > counts) >= 3
