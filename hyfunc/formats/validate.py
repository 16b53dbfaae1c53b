"""Check a call against the tools offered: the tool exists, and its arguments fit the schema.

Messages name the tool and the argument path (``units.kind``, ``dims[1]``) so a failed
generation or a bad training example can be diagnosed from the message alone.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from hyfunc.errors import InputError
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Param, Tool


class ArgumentError(InputError):
    """A call that does not fit the offered tools; `errors` lists every problem found."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors
        self.calls: list = []  # the offending call list, where the raiser has one (as JSON)


TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    # bool is an int subclass in Python, but True is not an integer argument.
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, dict),
    "any": lambda v: True,
}

_JSON_TYPE_NAMES = {
    bool: "boolean", int: "integer", float: "number", str: "string",
    list: "array", tuple: "array", dict: "object", type(None): "null",
}


def argument_errors(call: Call, tools: Iterable[Tool] | Mapping[str, Tool]) -> list[str]:
    """Every problem with `call` given the offered `tools` (a list, or a name -> Tool mapping)."""
    by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    tool = by_name.get(call.name)
    if tool is None:
        return [f"unknown tool {call.name!r}; offered: {', '.join(by_name) or '(none)'}"]
    errors: list[str] = []
    # At the top level the schema is closed: a tool without parameters takes no arguments.
    _check_object(call.arguments, tool.parameters, tool.required, tool.name, "", closed=True, errors=errors)
    return errors


def validate_call(call: Call, tools: Iterable[Tool] | Mapping[str, Tool]) -> None:
    errors = argument_errors(call, tools)
    if errors:
        raise ArgumentError(errors)


def _check_object(
    value: Mapping[str, Any],
    properties: Mapping[str, Param],
    required: list[str],
    tool: str,
    path: str,
    closed: bool,
    errors: list[str],
) -> None:
    for name, item in value.items():
        item_path = f"{path}.{name}" if path else str(name)
        param = properties.get(name)
        if param is not None:
            _check_value(item, param, tool, item_path, errors)
        elif closed:
            expected = ", ".join(properties) or "(none)"
            errors.append(f"{tool}: unknown argument {item_path!r}; expected one of: {expected}")
    for name in required:
        if name not in value:
            missing = f"{path}.{name}" if path else name
            errors.append(f"{tool}: missing required argument {missing!r}")


def _check_value(value: Any, param: Param, tool: str, path: str, errors: list[str]) -> None:
    if value is None and param.has_default and param.default is None:
        return  # passing the declared default None explicitly is fine
    if not TYPE_CHECKS[param.type](value):
        errors.append(f"{tool}: argument {path!r}: expected {param.type}, got {_describe(value)}")
        return
    if param.enum is not None and value not in param.enum:
        errors.append(f"{tool}: argument {path!r}: {value!r} is not one of {param.enum!r}")
    if param.type == "array" and param.items is not None:
        for i, item in enumerate(value):
            _check_value(item, param.items, tool, f"{path}[{i}]", errors)
    if param.type == "object":
        # An object schema without properties ("dict" in BFCL live docs) is free-form.
        _check_object(value, param.properties, param.required, tool, path, bool(param.properties), errors)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{_JSON_TYPE_NAMES.get(type(value), type(value).__name__)} {text}"
