"""hyfunc: a user request plus a tool library in, function calls out."""
from __future__ import annotations

import importlib
from typing import Any

# Resolved on first use (PEP 562): `import hyfunc.cli` or `hyfunc.data` then loads only what it needs,
# and `hyfunc --help` stays fast.
_PUBLIC = {
    "Answer": "hyfunc.methods",
    "Call": "hyfunc.formats.calls",
    "Method": "hyfunc.methods",
    "Tool": "hyfunc.formats.schema",
    "load_method": "hyfunc.methods",
    "parse_tools": "hyfunc.formats.schema",
}

__all__ = ["Answer", "Call", "Method", "Tool", "load_method", "parse_tools", "__version__"]


def _version() -> str:
    """The installed distribution's version: pyproject.toml is the one place it is written."""
    from importlib import metadata

    try:
        return metadata.version("hyfunc")
    except metadata.PackageNotFoundError:  # a source tree on sys.path that pip never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
