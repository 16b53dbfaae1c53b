"""Streamed tool calls: the growing JSON call list -> OpenAI's tool-call deltas.

Input: pieces of ``[{"name": "<name>", "arguments": {...}}, ...]``, each final (never taken back), as
the templating decoder writes them (`TemplateDecoder.decode(on_text=...)`) or as `calls_text` of a
finished answer. Output, per call kept: a head delta ``{"index", "id", "type": "function",
"function": {"name", "arguments": ""}}`` once its name is complete, then ``{"index", "function":
{"arguments": fragment}}`` as its arguments are written, one fragment per piece fed. The same
object assembles the non-streamed message (`tool_calls`), so a streamed answer and a non-streamed
one are equal by construction whenever the model writes the same text.

What must not reach a client (who may execute it) is dropped here, before anything is sent:

- a call to a tool that was not offered, and top-level arguments not in the tool's schema (the
  templating decoder never writes them; direct prompting may);
- under ``auto``, a call the assistant already made and got a result for (`skip`, see
  `Conversation.answered_calls`): whether a call repeats one is known only at its end, so a call
  that names such a tool is held back until it is closed, then sent whole (the latency cost);
- calls past `max_calls` (``parallel_tool_calls: false`` -> 1).

The arguments pass through as written (the decoder writes `json.dumps`'s separators); only the
whitespace between top-level keys is rewritten, since the object is rebuilt key by key.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Tool
from hyfunc.serving.conversation import call_key

_SPACE = " \t\r\n"


class CallStreamError(ValueError):
    """The text is not a JSON call list of the expected shape."""


class _Value:
    """Finds where one JSON value ends in a character stream (strings, nesting, scalars)."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = self.in_string = self.escape = self.scalar = False

    def take(self, ch: str) -> tuple[bool, bool]:
        """(is `ch` part of the value, is the value complete). A scalar ends at the first
        character after it, which is not part of it."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                return True, self.depth == 0
            return True, False
        if not self.started:
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth = 1
            else:
                self.scalar = True
            return True, False
        if self.scalar:
            return (False, True) if ch in ",}]" + _SPACE else (True, False)
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return True, self.depth == 0
        return True, False


@dataclass
class StreamedCall:
    id: str
    name: str
    arguments: str  # a JSON object, as sent

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class _Open:
    """The call being read."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.tool: Tool | None = None
        self.sent: StreamedCall | None = None  # set once its head is sent
        self.index = 0  # its index in the stream, once sent
        self.held = False  # kept back until it is closed
        self.dropped = False
        self.arguments = ""  # what the kept arguments are so far
        self.pending = ""  # of which not sent yet
        self.kept_keys = 0
        self.has_arguments = False


class CallStream:
    def __init__(
        self,
        tools: Sequence[Tool],
        emit: Callable[[dict[str, Any]], None] | None = None,
        max_calls: int | None = None,
        skip: Collection[str] = (),
        first_index: int = 0,
    ):
        """`emit` receives each delta (an element of a chunk's ``delta.tool_calls``); `skip`:
        `call_key`s of calls not to repeat; `first_index`: the index of the first call sent."""
        self.tools = {t.name: t for t in tools}
        self.emit = emit
        self.max_calls = max_calls
        self.skip = set(skip)
        self.skip_names = {json.loads(k)["name"] for k in self.skip}
        self.first_index = first_index
        self.calls: list[StreamedCall] = []
        self.notes: list[str] = []  # what was dropped, for the traffic log
        self.text = ""  # everything fed
        self._state = "start"
        self._buffer = ""  # a key or name string being read, or a skipped value
        self._key = ""
        self._keep_value = False
        self._value: _Value | None = None
        self._call: _Open | None = None

    # -- results ---------------------------------------------------------------------------
    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls as the non-streamed message has them."""
        return [c.openai() for c in self.calls]

    def parsed(self) -> list[Call]:
        return [Call(c.name, json.loads(c.arguments)) for c in self.calls]

    @property
    def done(self) -> bool:
        return self._state == "done"

    def close(self) -> None:
        """The text is complete: it must have been a whole call list."""
        if self._state != "done":
            raise CallStreamError(f"the call list ended early: {self.text[-80:]!r}")

    # -- reading ---------------------------------------------------------------------------
    def feed(self, piece: str) -> None:
        self.text += piece
        for ch in piece:
            while not self._step(ch):  # a character that ends a scalar is read again
                pass
        self._flush()

    def _fail(self, ch: str) -> None:
        raise CallStreamError(f"unexpected {ch!r} in state {self._state} of the call list: {self.text[-80:]!r}")

    def _step(self, ch: str) -> bool:
        """Read one character; False: it was not consumed, read it again in the new state."""
        state = self._state
        if state in ("name", "key", "arg_key"):  # inside a string being collected
            self._buffer += ch
            value = self._string_end()
            if value is not None:
                self._string_done(value)
            return True
        if state == "arg_value":
            assert self._value is not None
            part, complete = self._value.take(ch)
            if part and self._keep_value:
                self._add(ch)
            if complete:
                self._state = "arg_after"
            return part
        if state == "skip_value":
            assert self._value is not None
            part, complete = self._value.take(ch)
            if complete:
                self._state = "call_after"
            return part
        if ch in _SPACE:
            return True
        if state == "start":
            self._expect(ch, "[", "list")
        elif state in ("list", "list_item"):
            if ch == "]" and state == "list":
                self._state = "done"
            elif ch == "{":
                self._call, self._state = _Open(), "call_key"
            else:
                self._fail(ch)
        elif state == "list_after":
            if ch not in ",]":
                self._fail(ch)
            self._state = "list_item" if ch == "," else "done"
        elif state in ("call_key", "call_key_only"):
            if ch == '"':
                self._buffer, self._state = ch, "key"
            elif ch == "}" and state == "call_key":
                self._end_call()
            else:
                self._fail(ch)
        elif state == "call_colon":
            self._expect(ch, ":", "call_value")
        elif state == "call_value":
            self._call_value(ch)
        elif state == "call_after":
            if ch == ",":
                self._state = "call_key_only"
            elif ch == "}":
                self._end_call()
            else:
                self._fail(ch)
        elif state in ("arg_key_or_end", "arg_key_only"):
            if ch == '"':
                self._buffer, self._state = ch, "arg_key"
            elif ch == "}" and state == "arg_key_or_end":
                self._end_arguments()
            else:
                self._fail(ch)
        elif state == "arg_colon":
            self._expect(ch, ":", "arg_value_start")
        elif state == "arg_value_start":
            self._value, self._state = _Value(), "arg_value"
            return False
        elif state == "arg_after":
            if ch == ",":
                self._state = "arg_key_only"
            elif ch == "}":
                self._end_arguments()
            else:
                self._fail(ch)
        else:  # done: nothing may follow
            self._fail(ch)
        return True

    def _expect(self, ch: str, wanted: str, then: str) -> None:
        if ch != wanted:
            self._fail(ch)
        self._state = then

    def _string_end(self) -> str | None:
        """The decoded string once `_buffer` (from its opening quote) is closed."""
        raw = self._buffer
        if len(raw) < 2 or raw[-1] != '"':
            return None
        backslashes = len(raw) - 1 - len(raw[:-1].rstrip("\\"))
        if backslashes % 2:
            return None  # an escaped quote
        return json.loads(raw)

    def _string_done(self, value: str) -> None:
        call = self._call
        assert call is not None
        if self._state == "key":
            self._key, self._state = value, "call_colon"
        elif self._state == "name":
            self._name(call, value)
            self._state = "call_after"
        else:  # a top-level argument key
            tool = call.tool
            self._keep_value = not call.dropped and tool is not None and value in tool.parameters
            if not call.dropped and not self._keep_value:
                self.notes.append(f"dropped argument {value!r} of {call.name!r}, not in its schema")
            if self._keep_value:
                self._add((", " if call.kept_keys else "") + self._buffer + ": ")
                call.kept_keys += 1
            self._state = "arg_colon"

    def _call_value(self, ch: str) -> None:
        call = self._call
        assert call is not None
        if self._key == "name" and call.name is None:
            self._expect(ch, '"', "name")
            self._buffer = ch
        elif self._key == "arguments" and call.name is not None and not call.has_arguments:
            self._expect(ch, "{", "arg_key_or_end")
            call.has_arguments = True
            self._add("{")
        elif self._key in ("name", "arguments"):
            raise CallStreamError(f"expected a call's name before its arguments, each once: {self.text[-80:]!r}")
        else:  # another key: not part of a call; read past its value
            self._value, self._state = _Value(), "skip_value"
            self._value.take(ch)

    # -- decisions and sending -------------------------------------------------------------
    def _name(self, call: _Open, name: str) -> None:
        call.name = name
        call.tool = self.tools.get(name)
        if call.tool is None:
            call.dropped = True
            self.notes.append(f"dropped a call to {name!r}, not offered")
        elif self.max_calls is not None and len(self.calls) >= self.max_calls:
            call.dropped = True  # parallel_tool_calls: false
        elif name in self.skip_names:
            call.held = True  # may repeat an answered call: decided when closed
        else:
            self._send_head(call)

    def _send_head(self, call: _Open) -> None:
        assert call.name is not None
        # Random ids, like OpenAI's: ids must stay unique across the turns of one conversation.
        call.sent = StreamedCall(f"call_{uuid.uuid4().hex[:24]}", call.name, "")
        call.index = self.first_index + len(self.calls)
        self.calls.append(call.sent)
        if self.emit is not None:
            self.emit({"index": call.index, "id": call.sent.id, "type": "function",
                       "function": {"name": call.name, "arguments": ""}})

    def _add(self, text: str) -> None:
        call = self._call
        assert call is not None
        if call.dropped:
            return
        call.arguments += text
        call.pending += text

    def _end_arguments(self) -> None:
        self._add("}")
        self._state = "call_after"

    def _flush(self) -> None:
        call = self._call
        if call is None or call.sent is None or not call.pending:
            return
        call.sent.arguments += call.pending
        if self.emit is not None:
            self.emit({"index": call.index, "function": {"arguments": call.pending}})
        call.pending = ""

    def _end_call(self) -> None:
        call = self._call
        assert call is not None
        if call.name is None:
            raise CallStreamError(f"a call without a name: {self.text[-80:]!r}")
        if not call.has_arguments:
            self._add("{}")
        if call.held and not call.dropped:
            if call_key(Call(call.name, json.loads(call.arguments))) in self.skip:
                self.notes.append(f"dropped a repeat of the answered call {call.name}({call.arguments})")
            else:
                self._send_head(call)
        self._flush()
        self._call, self._state = None, "list_after"
