"""One internal representation of a tool, read from and written back to the formats hyfunc meets.

Three spellings of the same idea circulate:

- OpenAI tools: ``{"type": "function", "function": {name, description, parameters}}``;
- plain JSON Schema functions (xLAM-style training data): ``{name, description, parameters}`` with
  ``parameters = {"type": "object", "properties": ..., "required": ...}``;
- BFCL function docs: the same shape with Python type names (``dict``, ``float``, ``tuple``, ``any``).

All three become a `Tool` whose parameters are `Param` trees with canonical JSON Schema type names.
`Param.source_type` remembers the name the source used, because BFCL's checker distinguishes
e.g. ``float`` from ``integer`` and ``tuple`` from ``array``: a BFCL doc must be written back as read.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from hyfunc.errors import InputError


class SchemaError(InputError):
    """A tool definition hyfunc cannot use; the message names the tool and the field path."""


class _NoDefault(enum.Enum):
    # An enum member stays the same object through copy, deepcopy and pickle, so `is NO_DEFAULT`
    # remains a reliable test, and a default of None stays distinguishable from no default.
    NO_DEFAULT = "NO_DEFAULT"

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault.NO_DEFAULT

TYPES = ("string", "integer", "number", "boolean", "array", "object", "any")

# Source type names (lower-cased) -> canonical type: JSON Schema names plus the Python/BFCL names.
_TYPE_NAMES = {
    "string": "string", "str": "string",
    "integer": "integer", "int": "integer",
    "number": "number", "float": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array",
    "object": "object", "dict": "object",
    "any": "any",
}

# The names BFCL's python categories use; a source name outside them is replaced on output.
_BFCL_NAMES = {"string", "integer", "float", "boolean", "array", "tuple", "dict", "any"}
_BFCL_DEFAULT_NAME = {
    "string": "string", "integer": "integer", "number": "float", "boolean": "boolean",
    "array": "array", "object": "dict", "any": "any",
}


@dataclass
class Param:
    """One parameter (or nested value) schema.

    `items` describes array elements (None: any element); `properties`/`required` describe
    objects (no properties: a free-form object). `source_type` is the type name as read
    (e.g. "float", "tuple", "dict"); it defaults to `type`.
    """

    type: str
    description: str = ""
    enum: list[Any] | None = None
    default: Any = NO_DEFAULT
    items: Param | None = None
    properties: dict[str, Param] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)
    source_type: str = ""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"unknown canonical type {self.type!r}; expected one of {list(TYPES)}")
        if not self.source_type:
            self.source_type = self.type

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    @property
    def is_float(self) -> bool:
        """A number the source declares as a float ("float", "double"): a float value, not an integer."""
        return self.type == "number" and self.source_type.lower() in ("float", "double")

    def to_json_schema(self) -> dict[str, Any]:
        # JSON Schema has no "any" type name: leaving "type" out is how it says "anything".
        out: dict[str, Any] = {} if self.type == "any" else {"type": self.type}
        return self._add_keywords(out, lambda p: p.to_json_schema())

    def to_bfcl(self) -> dict[str, Any]:
        source = self.source_type.lower()
        keep = source in _BFCL_NAMES and _TYPE_NAMES[source] == self.type
        out: dict[str, Any] = {"type": source if keep else _BFCL_DEFAULT_NAME[self.type]}
        return self._add_keywords(out, lambda p: p.to_bfcl())

    def _add_keywords(self, out: dict[str, Any], render: Callable[[Param], dict[str, Any]]) -> dict[str, Any]:
        if self.description:
            out["description"] = self.description
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.has_default:
            out["default"] = self.default
        if self.items is not None:
            out["items"] = render(self.items)
        if self.properties or self.required:
            out["properties"] = {name: render(p) for name, p in self.properties.items()}
            out["required"] = list(self.required)
        return out


@dataclass
class Tool:
    """A callable function offered to the model: name, description and ordered parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Param] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)

    @property
    def optional(self) -> list[str]:
        return [name for name in self.parameters if name not in self.required]

    def to_json_schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {n: p.to_json_schema() for n, p in self.parameters.items()},
                "required": list(self.required),
            },
        }

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.to_json_schema()}

    def to_bfcl(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "dict",
                "properties": {n: p.to_bfcl() for n, p in self.parameters.items()},
                "required": list(self.required),
            },
        }

    @classmethod
    def from_openai(cls, d: Mapping[str, Any]) -> Tool:
        """Read ``{"type": "function", "function": {name, description, parameters}}``."""
        if not isinstance(d, Mapping) or d.get("type") != "function" or not isinstance(d.get("function"), Mapping):
            raise SchemaError(
                "not an OpenAI tool: expected {'type': 'function', 'function': {...}}, "
                f"got {_short(d)}"
            )
        return _read_function(d["function"])

    @classmethod
    def from_json_schema(cls, d: Mapping[str, Any]) -> Tool:
        """Read ``{name, description, parameters: {"type": "object", ...}}`` (xLAM / fc-train form).

        Python type names ("dict", "float", ...) are accepted too: they occur in the same shape.
        """
        return _read_function(d)


def parse_tool(d: Tool | Mapping[str, Any]) -> Tool:
    """Read one tool in any supported format (a `Tool` is returned as is)."""
    if isinstance(d, Tool):
        return d
    if isinstance(d, Mapping) and d.get("type") == "function" and "function" in d:
        return Tool.from_openai(d)
    # BFCL docs and JSON Schema functions share one shape; the type-name mapping covers both.
    return Tool.from_json_schema(d)


def parse_tools(seq: Iterable[Tool | Mapping[str, Any]]) -> list[Tool]:
    """Read a tool list; duplicate names are an error since calls refer to tools by name."""
    tools: list[Tool] = []
    seen: set[str] = set()
    for d in seq:
        tool = parse_tool(d)
        if tool.name in seen:
            raise SchemaError(f"tool {tool.name!r}: duplicate tool name")
        seen.add(tool.name)
        tools.append(tool)
    return tools


def _read_function(d: Any) -> Tool:
    if not isinstance(d, Mapping):
        raise SchemaError(f"tool definition must be an object, got {_short(d)}")
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SchemaError(f"tool definition {_short(d)}: name: must be a non-empty string, got {name!r}")
    description = _read_description(d, name, "")
    params = d.get("parameters")
    if params is None or params == {}:  # OpenAI allows omitting parameters for argument-less tools
        return Tool(name, description)
    if not isinstance(params, Mapping):
        raise _error(name, "", f"parameters: must be an object schema, got {_short(params)}")
    _, type_ = _read_type(params, name, "")
    if type_ != "object":
        raise _error(
            name, "", f"parameters: must be an object schema (type 'object' or 'dict'), got type {params.get('type')!r}"
        )
    properties, required = _read_properties(params, name, "")
    return Tool(name, description, properties, required)


def _read_param(d: Any, tool: str, path: str) -> Param:
    if not isinstance(d, Mapping):
        raise _error(tool, path, f"schema must be an object, got {_short(d)}")
    source_type, type_ = _read_type(d, tool, path)
    enum_values = d.get("enum")
    if enum_values is not None and not isinstance(enum_values, list):
        raise _error(tool, path, f"enum must be a list, got {_short(enum_values)}")
    items = None
    if type_ == "array" and d.get("items") is not None:
        items = _read_param(d["items"], tool, f"{path}[]")
    properties: dict[str, Param] = {}
    required: list[str] = []
    if type_ == "object":
        properties, required = _read_properties(d, tool, path)
    return Param(
        type=type_,
        description=_read_description(d, tool, path),
        enum=list(enum_values) if enum_values is not None else None,
        default=d.get("default", NO_DEFAULT),
        items=items,
        properties=properties,
        required=required,
        source_type=source_type,
    )


def _read_type(d: Mapping[str, Any], tool: str, path: str) -> tuple[str, str]:
    """Return (source type name, canonical type)."""
    raw = d.get("type")
    if raw is None:
        # JSON Schema may omit "type": infer what the keywords imply, otherwise anything goes.
        if "properties" in d:
            return "object", "object"
        if "items" in d:
            return "array", "array"
        return "any", "any"
    if isinstance(raw, list):
        # ["string", "null"] is the JSON Schema spelling of an optional value: keep the real type.
        names = [t for t in raw if t != "null"]
        for t in names:
            _canonical(t, tool, path)
        if len(names) == 1:
            return names[0], _canonical(names[0], tool, path)
        return "any", "any"
    return raw, _canonical(raw, tool, path)


def _canonical(name: Any, tool: str, path: str) -> str:
    if not isinstance(name, str):
        raise _error(tool, path, f"type must be a string or a list of strings, got {_short(name)}")
    canonical = _TYPE_NAMES.get(name.strip().lower())
    if canonical is None:
        raise _error(tool, path, f"unknown type {name!r}")
    return canonical


def _read_properties(d: Mapping[str, Any], tool: str, path: str) -> tuple[dict[str, Param], list[str]]:
    raw_props = d.get("properties") or {}
    if not isinstance(raw_props, Mapping):
        raise _error(tool, path, f"properties must be an object, got {_short(raw_props)}")
    properties = {
        name: _read_param(schema, tool, f"{path}.{name}" if path else name) for name, schema in raw_props.items()
    }
    required = d.get("required") or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _error(tool, path, f"required must be a list of names, got {_short(required)}")
    for name in required:
        if name not in properties:
            raise _error(tool, path, f"required: {name!r} is not a defined property")
    return properties, list(required)


def _read_description(d: Mapping[str, Any], tool: str, path: str) -> str:
    description = d.get("description")
    if description is None:
        return ""
    if not isinstance(description, str):
        raise _error(tool, path, f"description must be a string, got {_short(description)}")
    return description


def _error(tool: str, path: str, message: str) -> SchemaError:
    where = f"tool {tool!r}: parameter {path!r}" if path else f"tool {tool!r}"
    return SchemaError(f"{where}: {message}")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
