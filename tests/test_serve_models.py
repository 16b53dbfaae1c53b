"""`hyfunc serve` on real models, started by the real CLI and driven by the `openai` SDK.

SmolLM2-135M answers by direct prompting (it never writes a call untrained: `auto` gets a text
reply, `required` a call written by the templating decoder). The shipped cascade (1.5B + 0.5B,
about two minutes to load on a CPU) answers the README's request."""
from __future__ import annotations

import json
import sys

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.serve_process import running_server
from tests.test_serve_sdk import ASK, PARAMS, TOOLS

pytestmark = pytest.mark.integration


def _serve(*args: str) -> list[str]:
    return [sys.executable, "-m", "hyfunc.cli", "serve", "--port", "{port}", "--api-key", "secret", "--log-level", "warning", *args]


def test_smollm2_direct_through_the_sdk() -> None:
    with running_server(command=_serve("--method", "direct", "--model", "smollm2-135m"), startup=600) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="secret", max_retries=0, timeout=300)
        text = client.chat.completions.create(model="hyfunc", messages=[{"role": "user", "content": "Tell me a joke."}],
                                              tools=TOOLS, max_tokens=24)
        assert text.choices[0].message.content.strip() and not text.choices[0].message.tool_calls
        required = client.chat.completions.create(model="hyfunc", messages=ASK, tools=TOOLS, tool_choice="required",
                                                  parallel_tool_calls=False)
        (call,) = required.choices[0].message.tool_calls
        assert call.function.name in PARAMS and set(json.loads(call.function.arguments)) <= PARAMS[call.function.name]
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="hyfunc", messages=[{"role": "user", "content": "Tell me a joke."}], tools=TOOLS, max_tokens=24, stream=True)
            if chunk.choices)
        assert streamed == text.choices[0].message.content


def test_the_shipped_cascade_answers_the_readme_request() -> None:
    with running_server(command=_serve(), startup=900) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="secret", max_retries=0, timeout=600)
        raw = client.chat.completions.with_raw_response.create(model="hyfunc", messages=ASK, tools=TOOLS)
        done = raw.parse()
        assert raw.headers["x-hyfunc-path"] == "cascade"
        (call,) = done.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
        assert done.choices[0].finish_reason == "tool_calls"
        # Streamed: the arguments arrive in pieces as the templating decoder writes them, and add up
        # to the same call (the library state is cached by now on both requests' side).
        state = ChatCompletionStreamState()
        fragments = 0
        for chunk in client.chat.completions.create(model="hyfunc", messages=ASK, tools=TOOLS, stream=True):
            state.handle_chunk(chunk)
            fragments += sum(1 for d in (chunk.choices[0].delta.tool_calls or []) if d.id is None) if chunk.choices else 0
        (streamed,) = state.current_completion_snapshot.choices[0].message.tool_calls
        assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)
        assert fragments >= 2
        # The city is a free string: the large model wrote it (its stage large_values).
        assert 'stage="large_values"' in httpx.get(f"{url}/metrics").text
