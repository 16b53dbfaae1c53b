"""Chat messages as the methods read them.

A conversation reaches the methods as OpenAI-style chat dicts: system, user, assistant (text
and/or ``tool_calls``: ``{"id", "type": "function", "function": {"name", "arguments"}}``) and
tool (``{"tool_call_id", "content"}``) messages. Chat models read it through their own chat
template, which renders calls and results the way the model was trained to see them
(`BackendBase.chat_prompt`; `plain_chat` for templates that cannot). Parts that read one request
text (the small model, the lexical index, the off-topic gate, the router) read
`conversation_text`: the request alone, or a transcript of the conversation ending with what was
done for the request; a single request reads the same either way.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def call_arguments(call: Mapping[str, Any]) -> dict:
    """An OpenAI tool call's arguments as a dict (the wire form is a JSON string)."""
    arguments = call.get("function", call).get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return {"arguments": arguments}
    return arguments if isinstance(arguments, dict) else {"arguments": arguments}


def call_name(call: Mapping[str, Any]) -> str:
    return str(call.get("function", call).get("name", ""))


def render_call(call: Mapping[str, Any]) -> str:
    return f"{call_name(call)}({json.dumps(call_arguments(call), ensure_ascii=False)})"


def ends_with_tool_results(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the next step follows tool results: answer from them, or call again."""
    return bool(messages) and messages[-1].get("role") == "tool"


def follow_up_alone(messages: Sequence[Mapping[str, Any]]) -> list[dict] | None:
    """For a conversation that ends with a user message after earlier turns (a follow-up: "and
    in Berlin?", "now book it"), that message alone with the system messages; else None."""
    turns = [m for m in messages if m.get("role") in ("user", "assistant", "tool")]
    if len(turns) < 2 or turns[-1].get("role") != "user":
        return None
    return [dict(m) for m in messages if m.get("role") in ("system", "developer")] + [dict(turns[-1])]


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(c.get("id")): call_name(c) for m in messages for c in m.get("tool_calls") or []}


def _line(message: Mapping[str, Any], names: Mapping[str, str]) -> str:
    role, text = message.get("role"), content_text(message.get("content"))
    if role == "user":
        return f"User: {text}"
    if role == "tool":
        return f"Result of {names.get(str(message.get('tool_call_id')), 'a tool')}: {text}"
    parts = [f"Assistant: {text}"] if text else []
    parts += [f"Assistant called {render_call(c)}" for c in message.get("tool_calls") or []]
    return "\n".join(parts)


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as one request text (system messages left out): the last user message
    alone when nothing else was said, else a transcript of the earlier turns, the request, and
    the calls and results that followed it ("and in Berlin?" then arrives with the call for Paris
    in front of it)."""
    turns = [m for m in messages if m.get("role") in ("user", "assistant", "tool")]
    users = [i for i, m in enumerate(turns) if m.get("role") == "user"]
    if not users:
        return ""
    current = users[-1]
    request = content_text(turns[current].get("content"))
    if len(turns) == 1:
        return request
    names = _tool_names(turns)
    before = [_line(m, names) for m in turns[:current]]
    after = [_line(m, names) for m in turns[current + 1 :]]
    text = "Conversation so far:\n" + "\n".join(before) + "\n\n" if before else ""
    text += f"Request: {request}"
    if after:
        text += "\n\nDone so far for this request:\n" + "\n".join(after)
    return text


def plain_chat(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The conversation in system / user / assistant turns only, for chat templates that cannot
    render tool calls and results: calls become assistant text, results user turns, and
    consecutive turns of one role are merged (some templates require alternating roles)."""
    names = _tool_names(messages)
    out: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            text, role = content_text(message.get("content")), "system"
        elif role == "user":
            text = content_text(message.get("content"))
        elif role == "tool":
            text, role = _line(message, names), "user"
        else:
            text = _line(message, names).removeprefix("Assistant: ")
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})
    return out
