"""A whole OpenAI conversation, read into the forms the models take.

The methods (`Method.answer`) take chat messages but were trained on single requests: the
cascade's small model reads only the last user message, and both the cascade's soft token and
BFCL's direct prompt were tuned on one user turn. So a conversation with history is given to the
methods as ONE user message, a transcript of the earlier turns (earlier requests, the assistant's
calls and texts, the tool results) followed by the current request. "And in Berlin?" then arrives
with "get_weather({"city": "Paris"})" in front of it, which is what the small model needs to write
`get_weather(city="Berlin")`; a single-turn request passes through unchanged.

Text replies are written by the large model from a plain chat (system / user / assistant turns;
tool results become user turns, calls become assistant text), which any chat template renders.

Bounding: when the conversation does not fit the context budget, the OLDEST turns before the
current request are left out first (the system prompt, the current request and what followed
it are always kept); if even those do not fit, the request is refused (400).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from hyfunc.formats.calls import Call, CallParseError, from_openai_tool_calls
from hyfunc.serving.errors import APIError, bad_request
from hyfunc.serving.protocol import (
    AssistantMessage,
    Content,
    SystemMessage,
    ToolMessage,
    UserMessage,
)


@dataclass
class Turn:
    role: str  # user | assistant | tool
    text: str = ""
    calls: list[Call] = field(default_factory=list)  # assistant turns: the calls it made
    tool_name: str = ""  # tool turns: the tool whose result this is

    def line(self) -> str:
        """One transcript line of the turn (what the methods read)."""
        if self.role == "user":
            return f"User: {self.text}"
        if self.role == "tool":
            return f"Result of {self.tool_name}: {self.text}"
        parts = [f"Assistant: {self.text}"] if self.text else []
        parts += [f"Assistant called {render_call(c)}" for c in self.calls]
        return "\n".join(parts)


def render_call(call: Call) -> str:
    return f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"


def call_key(call: Call) -> str:
    return json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=True, ensure_ascii=False)


@dataclass
class Conversation:
    system: str  # system and developer messages, joined
    turns: list[Turn]
    current: int  # index in `turns` of the last user message: the request being answered
    dropped: int = 0  # earlier turns left out to fit the context

    @property
    def request(self) -> str:
        return self.turns[self.current].text

    def answered_calls(self) -> set[str]:
        """Calls the assistant already made for the current request and got results for: making
        them again would loop an agent forever, so under `auto` they are not repeated."""
        done = {t.tool_name for t in self.turns[self.current + 1 :] if t.role == "tool"}
        return {call_key(c) for t in self.turns[self.current + 1 :] for c in t.calls if c.name in done}

    def method_messages(self) -> list[dict]:
        """What `Method.answer` reads: the request alone, or a transcript ending with it."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        if len(self.turns) == 1:
            return out + [{"role": "user", "content": self.request}]
        return out + [{"role": "user", "content": self.transcript()}]

    def transcript(self) -> str:
        before = [t.line() for t in self.turns[: self.current]]
        after = [t.line() for t in self.turns[self.current + 1 :]]
        text = ""
        if before:
            text += "Conversation so far:\n" + "\n".join(before) + "\n\n"
        text += f"Request: {self.request}"
        if after:
            text += "\n\nDone so far for this request:\n" + "\n".join(after)
        return text

    def chat_messages(self, hint: str = "") -> list[dict]:
        """Plain chat turns for a text reply; consecutive turns of one role are merged, since
        some chat templates require alternating roles."""
        system = "\n\n".join(s for s in (self.system, hint) if s)
        out: list[dict] = [{"role": "system", "content": system}] if system else []
        for turn in self.turns:
            role = "assistant" if turn.role == "assistant" else "user"
            text = turn.line().removeprefix("Assistant: ") if role == "assistant" else (
                turn.text if turn.role == "user" else turn.line()
            )
            if out and out[-1]["role"] == role:
                out[-1]["content"] += "\n\n" + text
            else:
                out.append({"role": role, "content": text})
        return out

    def bounded(self, budget: int, count: Callable[[str], int]) -> Conversation:
        """The conversation without its oldest turns, so that its transcript takes at most
        `budget` tokens (as counted by `count`); 400 when the current request alone is too long."""
        conv = self
        while count(conv.system + conv.transcript()) > budget:
            if conv.current == 0:
                raise APIError(
                    400,
                    f"the request and its system prompt take more than the {budget} tokens left in the model's "
                    "context after the tools and the reply",
                    param="messages",
                    code="context_length_exceeded",
                )
            conv = replace(conv, turns=conv.turns[1:], current=conv.current - 1, dropped=conv.dropped + 1)
        return conv


def content_text(content: Content | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"{where}[{i}]: only text content parts are supported, got type {part.type!r}",
                param=f"{where}[{i}].type", code="unsupported_content",
            )
        texts.append(part.text)
    return "\n".join(texts)


def read_conversation(messages: Sequence[SystemMessage | UserMessage | AssistantMessage | ToolMessage]) -> Conversation:
    """Check the conversation's structure and read it; every refusal is a 400 naming the message."""
    system: list[str] = []
    turns: list[Turn] = []
    call_names: dict[str, str] = {}  # tool_call id -> tool name, to name the tool results
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(msg, SystemMessage):
            system.append(content_text(msg.content, f"{where}.content"))
        elif isinstance(msg, UserMessage):
            turns.append(Turn("user", content_text(msg.content, f"{where}.content")))
        elif isinstance(msg, AssistantMessage):
            try:
                calls = from_openai_tool_calls([tc.model_dump() for tc in msg.tool_calls or []])
            except CallParseError as err:
                raise bad_request(f"{where}.tool_calls: {err}", param=f"{where}.tool_calls") from None
            for tc in msg.tool_calls or []:
                call_names[tc.id] = tc.function.name
            turns.append(Turn("assistant", content_text(msg.content, f"{where}.content"), calls=calls))
        else:
            if msg.tool_call_id not in call_names:
                raise bad_request(
                    f"{where}: a 'tool' message must answer a tool call of an earlier assistant message; "
                    f"no call has id {msg.tool_call_id!r}",
                    param=f"{where}.tool_call_id",
                )
            turns.append(Turn("tool", content_text(msg.content, f"{where}.content"), tool_name=call_names[msg.tool_call_id]))
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    if not users:
        raise bad_request("messages: the conversation has no user message to answer", param="messages")
    if turns[-1].role == "assistant":
        raise bad_request(
            "messages: the last message is the assistant's; the last message must be a user message or tool results",
            param=f"messages[{len(messages) - 1}]",
        )
    return Conversation("\n\n".join(s for s in system if s), turns, users[-1])
