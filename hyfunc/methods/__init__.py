"""Answering methods: each turns (messages, tools) into an `Answer`."""
from __future__ import annotations

from hyfunc.methods.base import Answer, Method

# The prompting style that scored best on BFCL per default model (reports/baseline/).
PREFERRED_STYLE: dict[str, str] = {}


def load_method(
    name: str, model: str, style: str = "auto", device: str | None = None, prefix_caching: bool = False
) -> Method:
    """Build a method by name with its model(s) loaded."""
    if name != "direct":
        raise ValueError(f"unknown method {name!r}; available: direct")
    from hyfunc.methods.direct import DirectMethod
    from hyfunc.models.backend import Backend

    if style == "auto":
        style = PREFERRED_STYLE.get(model, "bfcl")
    return DirectMethod(Backend(model, device=device), style=style, prefix_caching=prefix_caching)


__all__ = ["Answer", "Method", "load_method", "PREFERRED_STYLE"]
