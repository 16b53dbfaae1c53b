"""A structured function call and the text forms models write it in.

- BFCL python syntax: ``[get_weather(city="Paris"), math.factorial(n=5)]`` (parsed with `ast`, never eval);
- JSON: ``{"name": ..., "arguments": {...}}`` or a list of them;
- Qwen/Hermes blocks: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` (one per call),
  or a fenced ```` ```json ```` block (Qwen-Coder's habit);
- OpenAI ``tool_calls`` entries, and the ``[{name: arguments}]`` list BFCL's AST checker reads.
"""
from __future__ import annotations

import ast
import json
import keyword
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def call_record(call: Call | Mapping[str, Any]) -> dict[str, Any]:
    """A call as the traffic log stores it: ``{"name", "arguments"}`` (a fresh dict)."""
    if isinstance(call, Mapping):
        return {"name": call["name"], "arguments": dict(call.get("arguments") or {})}
    return {"name": call.name, "arguments": dict(call.arguments)}


def calls_from_records(calls: Iterable[Call | Mapping[str, Any]]) -> list[Call]:
    """Logged ``{"name", "arguments"}`` objects (or Calls, passed through) as Calls."""
    return [c if isinstance(c, Call) else Call(**call_record(c)) for c in calls]


def same_calls(a: Iterable[Call], b: Iterable[Call]) -> bool:
    """The same calls, names and arguments exactly, in any order (an exact-match answer)."""
    def key(calls: Iterable[Call]) -> list[str]:
        return sorted(json.dumps({"name": c.name, "arguments": c.arguments}, sort_keys=True) for c in calls)

    return key(a) == key(b)


class CallParseError(ValueError):
    """Model output that attempts a call but cannot be read as one; the message says where."""


# ---------------------------------------------------------------------------------------------
# BFCL python syntax


def parse_python_calls(text: str) -> list[Call]:
    """Parse ``[f(a=1), pkg.g(b="x")]``; the outer brackets may be missing, calls may also be
    separated by commas or newlines. Values must be literals; tuples become lists (JSON has no
    tuple). Positional arguments are an error: a call must name its parameters.
    Whitespace-only text and ``[]`` mean no calls."""
    try:
        module = ast.parse(text.strip(), mode="exec")
    except SyntaxError as e:
        raise CallParseError(f"not valid Python call syntax (line {e.lineno}, column {e.offset}): {e.msg}") from None
    nodes: list[ast.expr] = []
    for statement in module.body:
        if not isinstance(statement, ast.Expr):
            raise CallParseError(f"expected call expressions, got a {type(statement).__name__} statement")
        value = statement.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    return [_read_python_call(node, i) for i, node in enumerate(nodes)]


def _read_python_call(node: ast.expr, index: int) -> Call:
    if not isinstance(node, ast.Call):
        raise CallParseError(f"call {index}: expected a function call, got {ast.unparse(node)!r}")
    name = _dotted_name(node.func)
    if name is None:
        raise CallParseError(f"call {index}: function must be a (dotted) name, got {ast.unparse(node.func)!r}")
    if node.args:
        raise CallParseError(
            f"call {index} ({name}): positional argument {ast.unparse(node.args[0])!r}; "
            "arguments must be passed by keyword"
        )
    arguments: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallParseError(f"call {index} ({name}): '**' unpacking is not allowed")
        if kw.arg in arguments:
            raise CallParseError(f"call {index} ({name}): argument {kw.arg!r} given twice")
        arguments[kw.arg] = _literal(kw.value, f"call {index} ({name}): argument {kw.arg!r}")
    return Call(name, arguments)


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr, where: str) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value  # bool is an int subclass; bytes, complex and Ellipsis fall through
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, f"{where}[{i}]") for i, e in enumerate(node.elts)]
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values):
            if key_node is None:
                raise CallParseError(f"{where}: '**' unpacking is not allowed")
            key = _literal(key_node, where)
            if isinstance(key, (list, dict)):
                raise CallParseError(f"{where}: dictionary key {ast.unparse(key_node)!r} is not a scalar")
            out[key] = _literal(value_node, f"{where}[{key!r}]")
        return out
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)  # excludes -True
    ):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    raise CallParseError(f"{where}: unsupported value {ast.unparse(node)!r}; only literals are allowed")


def render_python_calls(calls: Iterable[Call]) -> str:
    """Write calls in BFCL python syntax; `parse_python_calls` reads the result back unchanged."""
    return "[" + ", ".join(_render_python_call(c) for c in calls) + "]"


def _render_python_call(call: Call) -> str:
    if not all(_is_identifier(part) for part in call.name.split(".")):
        raise ValueError(f"function name {call.name!r} is not a dotted Python identifier")
    parts = []
    for name, value in call.arguments.items():
        if not _is_identifier(name):
            raise ValueError(f"{call.name}: argument name {name!r} is not a Python identifier")
        parts.append(f"{name}={_render_value(value)}")
    return f"{call.name}({', '.join(parts)})"


def _is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _render_value(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} has no Python literal form")
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_render_value(k)}: {_render_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write a {type(value).__name__} value as a literal: {value!r}")


# ---------------------------------------------------------------------------------------------
# JSON


def parse_json_calls(text: str) -> list[Call]:
    """Parse a call object ``{"name", "arguments"}`` (or ``"parameters"``), a list of them, or
    several such values one after another. ``arguments`` may be a JSON-encoded string (the OpenAI
    wire form); an OpenAI ``{"function": {...}}`` wrapper is unwrapped."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise CallParseError(f"invalid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
        values.extend(value if isinstance(value, list) else [value])
    return [_call_from_object(v, f"call {i}") for i, v in enumerate(values)]


def _call_from_object(obj: Any, where: str) -> Call:
    if not isinstance(obj, Mapping):
        raise CallParseError(f"{where}: expected an object with 'name' and 'arguments', got {json.dumps(obj)[:80]}")
    if isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise CallParseError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    key = "arguments" if "arguments" in obj else "parameters"
    arguments = obj.get(key, {})
    if isinstance(arguments, str):
        try:
            # Some servers send "" for a call without arguments.
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise CallParseError(f"{where} ({name}): '{key}' is a string but not valid JSON: {e.msg}") from None
    if not isinstance(arguments, dict):
        raise CallParseError(f"{where} ({name}): '{key}' must be an object, got {type(arguments).__name__}")
    return Call(name, arguments)


def _call_object(call: Call) -> dict[str, Any]:
    return {"name": call.name, "arguments": call.arguments}


def _dumps(value: Any) -> str:
    # allow_nan=False: NaN/Infinity are not JSON and no parser downstream would accept them.
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def render_json_calls(calls: Iterable[Call]) -> str:
    """Write a JSON list of ``{"name", "arguments"}`` objects."""
    return _dumps([_call_object(c) for c in calls])


# ---------------------------------------------------------------------------------------------
# Qwen / Hermes <tool_call> blocks and fenced JSON

# An unclosed last block is accepted: generation often stops on the stop token before the tag.
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def parse_tool_call_blocks(text: str) -> list[Call]:
    """Parse every ``<tool_call>...</tool_call>`` block (several = parallel calls); if there are
    none, every fenced block tagged ``json`` (or untagged, holding a JSON object/list of objects).
    Returns [] when the text has neither."""
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if not blocks:
        blocks = [
            body
            for lang, body in _FENCE.findall(text)
            if lang.lower() == "json" or (not lang and _looks_like_json(body))
        ]
    return [call for block in blocks for call in parse_json_calls(block)]


def _looks_like_json(text: str) -> bool:
    # "[{" / "[]" / "{" open JSON calls; "[f(" opens python syntax, so a bare "[" decides nothing.
    return re.match(r"\s*(\{|\[\s*[{\]])", text) is not None


def render_tool_call_blocks(calls: Iterable[Call]) -> str:
    return "\n".join(f"<tool_call>\n{_dumps(_call_object(c))}\n</tool_call>" for c in calls)


# ---------------------------------------------------------------------------------------------
# OpenAI tool_calls and BFCL checker input


def to_openai_tool_calls(calls: Iterable[Call]) -> list[dict[str, Any]]:
    # Random ids, like OpenAI's: ids must stay unique across the turns of one conversation.
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": _dumps(c.arguments)},
        }
        for c in calls
    ]


def from_openai_tool_calls(tool_calls: Iterable[Mapping[str, Any]]) -> list[Call]:
    return [_call_from_object(tc, f"tool_calls[{i}]") for i, tc in enumerate(tool_calls)]


def to_bfcl_output(calls: Iterable[Call]) -> list[dict[str, dict[str, Any]]]:
    return [{c.name: c.arguments} for c in calls]


# ---------------------------------------------------------------------------------------------
# Any of the above

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_PYTHON_START = re.compile(r"\s*(\[|[A-Za-z_][\w.]*\()")
# Call-shaped fragments that betray an attempt even when surrounded by prose.
_CALL_IN_PROSE = re.compile(r"[A-Za-z_][\w.]*\(\s*[A-Za-z_]\w*\s*=|\"name\"\s*:|<tool_call>|</tool_call>")


def parse_calls(text: str) -> list[Call]:
    """Read calls from model output in whichever supported form it uses.

    Order: ``<think>`` blocks are dropped; then ``<tool_call>`` blocks; else fenced code blocks
    (``json`` -> JSON; untagged/``python``/``tool_code`` -> JSON or python syntax by their first
    characters); else the whole text: JSON when it opens like a JSON call (``{``, ``[{``, ``[]``),
    python syntax when it opens with ``[`` or ``name(``.

    Returns [] when there are no calls: empty text, ``[]``, or prose with no call-shaped fragment.
    Raises CallParseError when the text attempts a call but it cannot be read: a recognised form
    that fails to parse, or a call-shaped fragment (``name(key=``, ``"name":``, a ``<tool_call>``
    tag) inside prose.
    """
    text = _THINK.sub("", text).strip()
    if not text:
        return []
    if "<tool_call>" in text:
        return parse_tool_call_blocks(text)
    fences = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    snippets = [(lang, body) for lang, body in fences if lang in ("", "json", "python", "py", "tool_code")]
    calls: list[Call] = []
    attempted = False
    for lang, body in snippets or [("", text)]:
        if lang == "json" or _looks_like_json(body):
            calls.extend(parse_json_calls(body))
        elif _PYTHON_START.match(body):
            calls.extend(parse_python_calls(body))
        else:
            continue
        attempted = True
    if attempted:
        return calls
    match = _CALL_IN_PROSE.search(text)
    if match:
        raise CallParseError(
            f"call-like text {match.group(0)!r} inside prose at offset {match.start()}; "
            "expected only calls (python syntax, JSON, or <tool_call> blocks)"
        )
    return []
