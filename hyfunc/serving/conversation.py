"""A whole OpenAI conversation, checked and read into the forms the models take.

The methods get the conversation as chat messages (`method_messages`: system, user, assistant
calls and tool results, `formats.messages`), which the large model reads through its own chat
template, calls and results included, as a chat model would; the parts trained on one request
text read its transcript (`formats.messages.conversation_text`). Text replies are written by the
large model from the same chat messages, with a hint in the system prompt (`chat_messages`).

Bounding: when the conversation does not fit the context budget, the OLDEST turns before the
current request are left out first (the system prompt, the current request and what followed
it are always kept), and the response's usage says how many; if even those do not fit, the
request is refused (400).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from hyfunc.formats.calls import Call, CallParseError, from_openai_tool_calls
from hyfunc.formats.messages import conversation_text
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
    call_ids: list[str] = field(default_factory=list)  # assistant turns: the calls' ids, in order
    tool_name: str = ""  # tool turns: the tool whose result this is
    call_id: str = ""  # tool turns: the call it answers

    def message(self) -> dict:
        """The turn as a chat message (arguments as a dict: chat templates render them as JSON)."""
        if self.role == "user":
            return {"role": "user", "content": self.text}
        if self.role == "tool":
            return {"role": "tool", "tool_call_id": self.call_id, "content": self.text}
        message: dict = {"role": "assistant", "content": self.text}
        if self.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in zip(self.call_ids, self.calls)
            ]
        return message


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
        """What `Method.answer` reads: the system prompt and the turns as chat messages."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        return out + [t.message() for t in self.turns]

    def transcript(self) -> str:
        return conversation_text(self.method_messages())

    def chat_messages(self, hint: str = "") -> list[dict]:
        """The chat messages a text reply is written from: `hint` joins the system prompt."""
        system = "\n\n".join(s for s in (self.system, hint) if s)
        return ([{"role": "system", "content": system}] if system else []) + [t.message() for t in self.turns]

    def bounded(self, budget: int, count: Callable[[str], int]) -> Conversation:
        """The conversation without its oldest turns, so that its transcript takes at most
        `budget` tokens (as counted by `count`); 400 when the current request alone is too long.
        A tool result is never kept without the call it answers: turns go up to the next user turn."""
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
            cut = 1 + next((i for i, t in enumerate(conv.turns[1:]) if t.role == "user"), conv.current - 1)
            conv = replace(conv, turns=conv.turns[cut:], current=conv.current - cut, dropped=conv.dropped + cut)
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
            ids = [tc.id for tc in msg.tool_calls or []]
            turns.append(Turn("assistant", content_text(msg.content, f"{where}.content"), calls=calls, call_ids=ids))
        else:
            if msg.tool_call_id not in call_names:
                raise bad_request(
                    f"{where}: a 'tool' message must answer a tool call of an earlier assistant message; "
                    f"no call has id {msg.tool_call_id!r}",
                    param=f"{where}.tool_call_id",
                )
            turns.append(Turn("tool", content_text(msg.content, f"{where}.content"), tool_name=call_names[msg.tool_call_id],
                              call_id=msg.tool_call_id))
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    if not users:
        raise bad_request("messages: the conversation has no user message to answer", param="messages")
    if turns[-1].role == "assistant":
        raise bad_request(
            "messages: the last message is the assistant's; the last message must be a user message or tool results",
            param=f"messages[{len(messages) - 1}]",
        )
    return Conversation("\n\n".join(s for s in system if s), turns, users[-1])
