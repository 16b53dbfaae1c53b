"""The OpenAI-compatible server: `create_app` builds it, `hyfunc serve` runs it.

Names are imported lazily: `hyfunc --help` should not pay for importing FastAPI.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ChatService", "Outcome", "Prepared", "Router", "ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from hyfunc.serving.app import create_app

        return create_app
    if name in __all__:
        from hyfunc.serving import service

        return getattr(service, name)
    raise AttributeError(f"module 'hyfunc.serving' has no attribute {name!r}")
