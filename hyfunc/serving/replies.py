"""What the server asks of a model beyond `Method.answer`, written against the `Backend` API:

- a text reply (no tool fits, `tool_choice: none`, no tools, or an answer after tool results),
  greedy, streamed token by token through a callback, never empty;
- a forced call (`tool_choice: required` or a named tool when the method made no call): the
  templating decoder writes a schema-valid call to one of the offered tools, and must write one.

What a text reply reuses: it is written by the large model from a plain chat prompt (system,
hint, the conversation's turns; after tool results, the request asked again), through a `PrefixCache` kept per model, so what the prompt shares
with the previous text reply's is not run again: the system prompt and hint (the same for
requests on the same tools) and, in an agent loop where each request extends the last one, the
whole earlier conversation. The cascade's own pass over [instruction + tools + request] is NOT
continued: that prompt asks for function calls, and continuing it biases the reply toward a call
(the 1.5B calls a function on every irrelevant request under such a prompt), which is exactly
what a text reply must not be; its KV cache shares only the chat template's first tokens with
the plain prompt, so there is nothing to gain from it either.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from hyfunc.formats.calls import Call
from hyfunc.formats.messages import content_text
from hyfunc.formats.schema import Tool
from hyfunc.models.base import PrefixCache
from hyfunc.serving.conversation import Conversation

#: Said when the model's reply is empty: an empty assistant message makes agents loop.
FALLBACK_TEXT = "I cannot help with this request using the available tools."

CALL_INSTRUCTION = (
    "You write function calls. Answer with a JSON list of calls "
    '[{"name": ..., "arguments": {...}}] to the functions below.'
    "\n\nFunctions, one JSON schema per line:\n"
)


#: Joins the system prompt of a text reply written after tool results.
ANSWER_FROM_RESULTS = "Answer the user's request in plain text, using the function results above."


def with_results_reminder(messages: Sequence[dict]) -> list[dict]:
    """`messages`, and when tool results follow the last user message, a user turn after them that
    asks the request again and names the functions whose results the answer must use: asked only
    in the system prompt, the 1.5B mostly repeats the last result alone (reports/final-answers/prompts)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    after = list(messages[users[-1] + 1 :]) if users else []
    if not any(m.get("role") == "tool" for m in after):
        return list(messages)
    names = [c["function"]["name"] for m in after if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    used = f" ({', '.join(dict.fromkeys(names))})" if names else ""
    request = content_text(messages[users[-1]].get("content"))
    reminder = (f"Using the function results above{used}, answer my request in plain text: {request}\n"
                "Tell me every result I asked for, with its exact values.")
    return [*messages, {"role": "user", "content": reminder}]


def reply_messages(conversation: Conversation, tools: Sequence[Tool], choice: str) -> list[dict]:
    """The chat messages a text reply is written from: the conversation, a hint for the case in
    the system prompt (tools offered but `tool_choice` none, tool results to answer from, or no
    offered tool fits), and after tool results the request asked again (`with_results_reminder`)."""
    hint = ""
    if tools and choice == "none":
        hint = "Answer in plain text, without calling any function."
    elif tools and any(t.role == "tool" for t in conversation.turns[conversation.current :]):
        hint = ANSWER_FROM_RESULTS
    elif tools:
        names = f"({', '.join(t.name for t in tools)}) " if len(tools) <= 20 else ""
        hint = (f"None of the {len(tools)} available functions {names}fits this request: answer the user directly "
                "in plain text, without calling any function.")
    return with_results_reminder(conversation.chat_messages(hint))


#: How a chat model's reply opens when it writes a call instead of text (Qwen's `<tool_call>` tag
#: is a special token, decoded away, which leaves the JSON).
CALL_OPENERS = ('{"name"', '[{"name"', "<tool_call>")


def _could_open_a_call(visible: str) -> bool:
    compact = visible.replace(" ", "").replace("\n", "")
    return any(opener.startswith(compact) or compact.startswith(opener) for opener in CALL_OPENERS)


@dataclass
class TextReply:
    text: str
    input_tokens: int
    output_tokens: int
    seconds: float
    truncated: bool  # stopped by max_tokens: finish_reason "length"
    cached_tokens: int = 0  # prompt tokens reused from the previous reply's KV cache
    # The model wrote a call where a text reply was asked: its text, never sent as text (the
    # caller may turn it into tool calls); `text` is then empty.
    call_text: str = ""


@dataclass
class ForcedCalls:
    calls: list[Call]
    input_tokens: int
    generated_tokens: int
    injected_tokens: int
    prefill_seconds: float
    decode_seconds: float


class _Deltas:
    """Turns the growing decoded text into deltas: leading whitespace is held back (a reply does
    not start with a blank line), and so is a trailing partial UTF-8 character (the tokenizer
    decodes half a character as U+FFFD, which the next token replaces), and so is a reply while it
    may still open a call (`CALL_OPENERS`): a call is not sent as text. The reply is exactly the
    concatenation of the deltas sent, so a streamed reply equals the non-streamed one."""

    def __init__(self, on_delta: Callable[[str], None] | None, hold_calls: bool):
        self.on_delta = on_delta
        self.hold_calls = hold_calls
        self.sent = ""

    def feed(self, text: str) -> None:
        visible = text.lstrip()
        if visible.endswith("\ufffd") or not visible.startswith(self.sent):
            return
        if self.hold_calls and not self.sent and _could_open_a_call(visible):
            return
        self._send(visible[len(self.sent) :])

    def finish(self, text: str) -> tuple[str, str]:
        """(the text reply, or the call text the model wrote instead)."""
        visible = text.lstrip()
        if self.hold_calls and not self.sent and visible and _could_open_a_call(visible):
            return "", visible
        if visible.startswith(self.sent):
            self._send(visible[len(self.sent) :].replace("\ufffd", ""))
        if not self.sent.strip():
            self._send(FALLBACK_TEXT)
        return self.sent, ""

    def _send(self, delta: str) -> None:
        if not delta:
            return
        self.sent += delta
        if self.on_delta is not None:
            self.on_delta(delta)


def write_text(
    backend: Any,
    messages: Sequence[dict],
    max_tokens: int,
    on_delta: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    prefix_cache: PrefixCache | None = None,
    hold_calls: bool = False,
) -> TextReply:
    """Greedy reply to chat `messages`; `should_stop` (deadline, client gone) ends it early;
    `prefix_cache`: the prompt ids shared with the previous reply through it are not run again;
    `hold_calls` (tools were offered): a reply that opens like a call is returned as `call_text`."""
    start = time.perf_counter()
    ids = backend.encode(backend.chat_prompt(list(messages)))
    deltas = _Deltas(on_delta, hold_calls)

    def stop(text: str) -> bool:
        deltas.feed(text)
        return should_stop()

    gen = backend.generate(ids=ids, max_new_tokens=max_tokens, stop=stop, prefix_cache=prefix_cache)
    text, call_text = deltas.finish(gen.text)
    return TextReply(
        text=text,
        call_text=call_text,
        input_tokens=len(ids),
        output_tokens=len(gen.token_ids),
        seconds=time.perf_counter() - start,
        truncated=len(gen.token_ids) >= max_tokens,
        cached_tokens=gen.cached_tokens,
    )


class CallWriter:
    """Forced calls with the templating decoder; one decoder per (backend, max_calls), since a
    decoder builds its vocabulary tables once (seconds for a 150k-token vocabulary)."""

    def __init__(self) -> None:
        self._decoders: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def _decoder(self, backend: Any, max_calls: int) -> Any:
        # Imported here: the templating package is heavy and only needed for forced calls.
        from hyfunc.cascade.templating import TemplateDecoder

        key = (id(backend), max_calls)
        with self._lock:
            if key not in self._decoders:
                self._decoders[key] = TemplateDecoder(backend, max_calls=max_calls)
            return self._decoders[key]

    def write(
        self, backend: Any, request: str, tools: Sequence[Tool], single: bool, on_text: Callable[[str], None] | None = None
    ) -> ForcedCalls:
        """`on_text`: the call list's JSON text as the decoder writes it (`TemplateDecoder.decode`)."""
        start = time.perf_counter()
        system = CALL_INSTRUCTION + "\n".join(json.dumps(t.to_json_schema(), ensure_ascii=False) for t in tools)
        ids = backend.encode(backend.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": request}]))
        step = backend.forward(ids=ids)
        prefilled = time.perf_counter()
        out = self._decoder(backend, 1 if single else 8).decode(
            step, list(tools), require_call=True, draft_source=request, on_text=on_text
        )
        return ForcedCalls(
            calls=out.calls,
            input_tokens=len(ids),
            generated_tokens=out.generated_tokens,
            injected_tokens=out.injected_tokens,
            prefill_seconds=prefilled - start,
            decode_seconds=time.perf_counter() - prefilled,
        )
