"""Agent frameworks as clients of `hyfunc serve`: LangChain (langchain-openai's ChatOpenAI, and
`create_agent`'s loop) and pydantic-ai (`Agent` on its OpenAI provider), each against a real
server process on loopback.

An agent's loop sends the tools, gets a call, runs the tool, sends its result back as a `tool`
message and must then get a text answer that uses the result. The protocol tests run that round
trip on tiny random models (their words are nonsense: only the messages' shape is checked); the
loop tests run it on real models, through the direct-prompting path and the shipped cascade.

A `tool` message answering no earlier call is a 400 naming `messages[i].tool_call_id`: covered
through the openai SDK in test_serve_errors.py ("orphan-tool-result")."""
from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Callable, Literal

import openai
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from pydantic_ai import Agent
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from tests.serve_process import running_server

KEY = "agent-key"
FINISH_REASONS = {"stop", "length", "tool_calls"}
WEATHER = "12 degrees celsius, light rain"
# Markup of the server's own transcripts and of call formats: a text answer must carry none of it.
MARKUP = ("<tool_call>", "Assistant called", '{"name":', "Result of get_weather", "Done so far for this request")
# The most model requests a loop may take: call, answer, and room to see a loop that does not end.
MAX_REQUESTS = 4


def _langchain_model(url: str, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=f"{url}/v1", api_key=KEY, model="hyfunc", max_retries=0, timeout=600, **kwargs)


def _pydantic_model(url: str) -> OpenAIChatModel:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
    return OpenAIChatModel("hyfunc", provider=OpenAIProvider(openai_client=client))


# ---------------------------------------------------------------------------------------------
# The protocol, on tiny random models: the tiny cascade's retriever keeps every tool, so its first
# answer is a call; after the result, any well-formed reply (text or calls) will do.


@pytest.fixture(scope="module")
def tiny_server() -> Any:
    with running_server({"method": "cascade", "api_key": KEY}) as url:
        yield url


def forecast(city: str) -> dict:
    """Current weather of a city."""
    return {"city": city, "temperature": 12, "unit": "celsius", "sky": "light rain"}


def _check_langchain_reply(reply: AIMessage, offered: set[str]) -> None:
    assert reply.response_metadata["finish_reason"] in FINISH_REASONS
    assert reply.response_metadata["model_name"] == "hyfunc"
    assert isinstance(reply.content, str) and not reply.invalid_tool_calls
    assert reply.content or reply.tool_calls
    for call in reply.tool_calls:
        assert call["name"] in offered and call["id"].startswith("call_") and isinstance(call["args"], dict)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_langchain_round_trip_with_a_json_tool_result(tiny_server: str, stream: bool) -> None:
    bound = _langchain_model(tiny_server, streaming=stream).bind_tools([tool(forecast)])
    messages: list[Any] = [SystemMessage("You answer weather questions."), HumanMessage("What is the weather in Oslo?")]
    first = bound.invoke(messages)
    _check_langchain_reply(first, {"forecast"})
    assert first.tool_calls and first.response_metadata["finish_reason"] == "tool_calls"
    messages.append(first)
    for call in first.tool_calls:  # the result as an agent sends it: the tool's JSON, answering the call's id
        messages.append(ToolMessage(json.dumps(forecast(**call["args"])), tool_call_id=call["id"]))
    second = bound.invoke(messages)
    _check_langchain_reply(second, {"forecast"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_pydantic_ai_round_trip_with_a_json_tool_result(tiny_server: str, stream: bool) -> None:
    agent = Agent(_pydantic_model(tiny_server), tools=[forecast], instructions="You answer weather questions.")

    async def two_requests() -> list[Any]:
        """Steps the agent's own loop up to its second model response: the one after the tool result."""
        async with agent.iter("What is the weather in Oslo?") as run:
            node = run.next_node
            responses = 0
            while responses < 2:
                if stream and Agent.is_model_request_node(node):
                    async with node.stream(run.ctx) as events:
                        async for _ in events:
                            pass
                node = await run.next(node)
                responses += Agent.is_call_tools_node(node)
            return list(run.ctx.state.message_history)

    history = asyncio.run(two_requests())
    first_response, result, second_response = history[1:4]
    assert isinstance(first_response, ModelResponse) and first_response.finish_reason == "tool_call"
    calls = [p for p in first_response.parts if isinstance(p, ToolCallPart)]
    assert calls and {c.tool_name for c in calls} == {"forecast"}
    # pydantic-ai ran the tool and sent its dict back as JSON, one return per call.
    assert isinstance(result, ModelRequest)
    returns = [p for p in result.parts if isinstance(p, ToolReturnPart)]
    assert sorted(r.tool_call_id for r in returns) == sorted(c.tool_call_id for c in calls)
    assert all(r.content["temperature"] == 12 for r in returns)
    assert isinstance(second_response, ModelResponse) and second_response.parts
    assert second_response.provider_response_id.startswith("chatcmpl-")
    assert second_response.provider_details["finish_reason"] in FINISH_REASONS
    for part in second_response.parts:
        assert isinstance(part, (TextPart, ToolCallPart))
        if isinstance(part, ToolCallPart):
            assert part.tool_name == "forecast" and isinstance(part.args_as_dict(), dict)


# ---------------------------------------------------------------------------------------------
# The real loop: a two-tool task on real models. The answer must state the tool's result, and
# the tool must have run once: an agent whose server calls again after the result never stops.

SERVERS = {
    "direct": ["--method", "direct", "--model", "qwen-coder-1.5b"],
    "cascade": [],  # the shipped defaults
}


@pytest.fixture(scope="module", params=list(SERVERS))
def real_server(request: pytest.FixtureRequest) -> Any:
    """One server per configuration for the module (pytest orders the tests so each starts once)."""
    command = [sys.executable, "-m", "hyfunc.cli", "serve", "--port", "{port}", "--api-key", KEY,
               "--log-level", "warning", *SERVERS[request.param]]
    with running_server(command=command, startup=900) as url:
        yield url


def _task_tools(calls: list[tuple[str, dict]]) -> list[Callable[..., str]]:
    """The agent's two tools; each records its call."""

    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
        """Current weather of a city."""
        calls.append(("get_weather", {"city": city, "unit": unit}))
        return WEATHER

    def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
        """Convert an amount of money from one currency to another (ISO 4217 codes)."""
        calls.append(("convert_currency", {"amount": amount, "from_currency": from_currency, "to_currency": to_currency}))
        return f"{amount} {from_currency} is {amount * 11.6:.2f} {to_currency}"

    return [get_weather, convert_currency]


QUESTION = "What is the weather in Oslo right now?"


def _check_loop(answer: str | None, calls: list[tuple[str, dict]]) -> None:
    assert len(calls) == 1, f"the tool ran {len(calls)} times: {calls}"
    name, arguments = calls[0]
    assert name == "get_weather" and "oslo" in arguments["city"].lower()
    assert answer is not None, f"the loop did not end in {MAX_REQUESTS} model requests"
    assert "12" in answer, answer
    for markup in MARKUP:
        assert markup not in answer, answer


@pytest.mark.integration
def test_langchain_agent_finishes_its_loop(real_server: str) -> None:
    calls: list[tuple[str, dict]] = []
    agent = create_agent(_langchain_model(real_server), tools=[tool(f) for f in _task_tools(calls)])
    try:
        # Each model request and each tool run is one step of the graph.
        out = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]}, {"recursion_limit": 2 * MAX_REQUESTS})
    except GraphRecursionError:
        answer = None
    else:
        last = out["messages"][-1]
        assert isinstance(last, AIMessage) and not last.tool_calls
        answer = last.text
    _check_loop(answer, calls)


@pytest.mark.integration
def test_pydantic_ai_agent_finishes_its_loop(real_server: str) -> None:
    calls: list[tuple[str, dict]] = []
    agent = Agent(_pydantic_model(real_server), tools=_task_tools(calls))
    try:
        answer = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=MAX_REQUESTS)).output
    except UsageLimitExceeded:
        answer = None
    _check_loop(answer, calls)
