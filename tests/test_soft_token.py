import pytest
import torch

from hyfunc.cascade.soft_token import Encoding, LibraryCache, SoftTokenEncoder, tool_line
from hyfunc.formats.schema import parse_tools
from tests.tiny_models import tiny_backend

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {
        "name": "book table",  # a space: names need not be identifiers
        "description": "Book a table",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": []},
    },
    {"name": "f", "description": "", "parameters": {}},
]
REQUEST = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def encoder() -> SoftTokenEncoder:
    return SoftTokenEncoder(tiny_backend())


def test_shapes(encoder):
    enc = encoder.encode(REQUEST, TOOLS)
    assert isinstance(enc, Encoding)
    assert enc.soft_token.shape == (encoder.backend.hidden_size,)
    assert enc.function_embeddings.shape == (len(TOOLS), encoder.backend.hidden_size)
    assert enc.input_tokens == len(encoder.layout(REQUEST, TOOLS).ids)
    assert enc.seconds > 0 and enc.cached_tokens == 0
    assert enc.soft_token.dtype == torch.float32 and not enc.soft_token.is_inference()


def test_layout_is_the_chat_prompt_and_spans_are_the_tools(encoder):
    layout = encoder.layout(REQUEST, TOOLS)
    tok = encoder.backend.tokenizer
    text = tok.decode(layout.ids)
    assert text.startswith(layout.before_text) and REQUEST in text
    assert text.endswith(encoder.backend.chat_prompt([{"role": "user", "content": REQUEST}])[-30:])
    for tool, (start, end) in zip(parse_tools(TOOLS), layout.spans):
        assert tok.decode(layout.ids[start:end]) == tool_line(tool)
    assert layout.prefix_len == layout.spans[-1][1]


def test_soft_token_is_last_hidden_state_of_full_prompt(encoder):
    enc = encoder.encode(REQUEST, TOOLS)
    layout = encoder.layout(REQUEST, TOOLS)
    step = encoder.backend.forward(ids=layout.ids)
    assert torch.allclose(enc.soft_token, step.hidden[-1].float(), atol=1e-6)
    start, end = layout.spans[1]
    assert torch.allclose(enc.function_embeddings[1], step.hidden[start:end].float().mean(0), atol=1e-6)


def test_library_cache_equals_full_forward(encoder):
    library = encoder.build_library(TOOLS)
    assert isinstance(library, LibraryCache)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Book a table for two"}]
    for request in (REQUEST, messages):
        full = encoder.encode(request, TOOLS)
        cached = encoder.encode(request, library)
        assert torch.allclose(full.soft_token, cached.soft_token, atol=1e-5)
        assert torch.allclose(full.function_embeddings, cached.function_embeddings, atol=1e-5)
        assert cached.cached_tokens == len(library) and cached.input_tokens < full.input_tokens
    # the library's cache is forked, not consumed: a second request still matches
    assert torch.allclose(encoder.encode(REQUEST, library).soft_token, encoder.encode(REQUEST, TOOLS).soft_token, atol=1e-5)


def test_per_function_mode(encoder):
    emb = encoder.embed_functions(TOOLS, batch_size=2)
    assert emb.shape == (len(TOOLS), encoder.backend.hidden_size)
    # batching with right padding changes nothing
    assert torch.allclose(emb, encoder.embed_functions(TOOLS, batch_size=1), atol=1e-5)
    # the first tool of a joint prompt sees exactly what a tool alone sees
    assert torch.allclose(emb[0], encoder.encode(REQUEST, TOOLS).function_embeddings[0], atol=1e-5)
    assert encoder.embed_functions([]).shape == (0, encoder.backend.hidden_size)

    alone = encoder.encode_request(REQUEST)
    assert torch.allclose(alone.soft_token, encoder.encode(REQUEST, []).soft_token, atol=1e-5)
    assert alone.function_embeddings.shape == (0, encoder.backend.hidden_size) and alone.cached_tokens > 0


def test_batched_requests_equal_one_at_a_time(encoder):
    requests = [REQUEST, "Book a table for four people tonight, please, at eight.", "Hi"]  # lengths differ: padding
    batched = encoder.encode_requests(requests)
    assert batched.shape == (3, encoder.backend.hidden_size)
    for row, request in zip(batched, requests):
        assert torch.allclose(row, encoder.encode_request(request).soft_token, atol=1e-5)
    assert encoder.encode_requests([]).shape == (0, encoder.backend.hidden_size)
