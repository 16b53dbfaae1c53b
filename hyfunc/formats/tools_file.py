"""A tool library read from a JSON file, with one clear message for each way the file can be wrong."""
from __future__ import annotations

import json
from pathlib import Path

from hyfunc.errors import InputError
from hyfunc.formats.schema import SchemaError, Tool, parse_tools

#: What the file must hold, said in every error about its shape.
EXPECTED = "expected a JSON list of tools (OpenAI, BFCL or JSON Schema) or an object {\"tools\": [...]}"


def read_tools_file(path: str | Path) -> list[Tool]:
    """The tools in `path`: a JSON list of tools, or an object whose "tools" key holds that list.

    Raises InputError naming the file for a missing file, text that is not JSON, a value of the
    wrong shape, or a tool definition hyfunc cannot use (the schema error names the tool).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"tools file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read tools file {str(path)!r}: {err}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"tools file {str(path)!r} is not JSON ({err}); {EXPECTED}") from None
    if isinstance(raw, dict):
        if "tools" not in raw:
            keys = ", ".join(map(repr, list(raw)[:5])) or "none"
            raise InputError(f"tools file {str(path)!r}: the object has no \"tools\" key (keys: {keys}); {EXPECTED}")
        raw = raw["tools"]
    if not isinstance(raw, list):
        raise InputError(f"tools file {str(path)!r} holds {_json_type(raw)}; {EXPECTED}")
    if not raw:
        raise InputError(f"tools file {str(path)!r} holds no tools; {EXPECTED}")
    try:
        return parse_tools(raw)
    except SchemaError as err:
        raise InputError(f"tools file {str(path)!r}: {err}") from None


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", type(None): "null", dict: "an object"}
    return names.get(type(value), type(value).__name__)
