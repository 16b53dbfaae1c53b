"""Answering methods: each turns (messages, tools) into an `Answer`."""
from __future__ import annotations

from typing import Literal, get_args

from hyfunc.errors import InputError
from hyfunc.methods.base import Answer, Method

# Direct prompting's styles (hyfunc.methods.direct), here so that the command line lists them without torch.
PromptStyle = Literal["bfcl", "native"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)

# The prompting style that scored best on BFCL per default model (reports/baseline/styles.md):
# BFCL's own python-call prompt beat the native tool template for both Qwen-Coder models;
# SmolLM2's chat template has no tool support, so BFCL's prompt is its only style.
PREFERRED_STYLE: dict[str, str] = {"qwen-coder-1.5b": "bfcl", "qwen-coder-0.5b": "bfcl", "smollm2-135m": "bfcl"}


METHODS = ("direct", "hyfunc")

# The cascade's switchable stages: the fields of hyfunc.methods.cascade.CascadeOptions (not imported
# here, it needs torch; a test keeps the two equal).
ABLATABLE = ["soft_token", "retriever", "templating", "off_topic_gate", "large_values", "large_choices", "large_numbers",
             "described_forms", "value_drafts", "alternatives", "small_model", "follow_up_alone",
             "gate_confirms_alone"]


def load_method(
    name: str,
    model: str | None = None,
    style: str = "auto",
    device: str | None = None,
    prefix_caching: bool = False,
    artifact: str | None = None,
    ablate: tuple[str, ...] = (),
    backend=None,
    engine: str = "auto",
    small_engine: str | None = None,
) -> Method:
    """Build a method by name with its model(s) loaded.

    direct: `model` answers with every tool in its prompt. hyfunc: the cascade prepared in the
    `artifact` directory (default: the shipped one); `ablate` switches stages off ("soft_token",
    "retriever", "templating"). `backend`: an already loaded Backend of `model` to reuse (direct).
    `engine`: transformers or llamacpp for every model (`small_engine`: the cascade's small model
    on another one).
    """
    if name == "hyfunc":
        from hyfunc.methods.cascade import (
            DEFAULT_ARTIFACT,
            CascadeOptions,
            HyFuncMethod,
        )

        options = CascadeOptions.without(*ablate)
        return HyFuncMethod.load(
            artifact or DEFAULT_ARTIFACT, options=options, device=device, large_engine=engine, small_engine=small_engine or engine
        )
    if name != "direct":
        raise InputError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    if model is None:
        raise InputError("method 'direct' needs a model")
    from hyfunc.methods.direct import DirectMethod
    from hyfunc.models.engines import load_backend

    if style == "auto":
        style = PREFERRED_STYLE.get(model, "bfcl")
    if backend is None:
        backend = load_backend(model, engine, device=device)
    return DirectMethod(backend, style=style, prefix_caching=prefix_caching)


__all__ = ["Answer", "Method", "METHODS", "load_method", "PREFERRED_STYLE", "PROMPT_STYLES"]
