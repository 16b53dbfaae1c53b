"""Learning from traffic (ODIA): what was served, which requests are simple, where to route them.

The Python API in brief (names load on first use):

- `TrafficLog(url=None)`: the buffered traffic log (embedded SQLite in $HYFUNC_HOME, or a
  PostgreSQL URL); `RecordedMethod(method, log)` logs every answer of a method to it.
- `RoutedMethod.load(cascade, versions_dir)`: the router's choice, per request, between the
  small path and the cascade, following the champion that `hyfunc odia cycle` promotes.
"""
from __future__ import annotations

from typing import Any

_LAZY = {
    "TrafficLog": "hyfunc.routing.traffic",
    "RecordedMethod": "hyfunc.routing.recording",
    "RoutedMethod": "hyfunc.routing.routed",
    "SmallMethod": "hyfunc.methods.small",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hyfunc.routing' has no attribute {name!r}")
