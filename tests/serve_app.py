"""App factories for the server tests: the real app around tiny random models (no weights).

Run by uvicorn in a subprocess: ``python -m uvicorn --factory tests.serve_app:create``. The
environment variable HYFUNC_TEST_SERVE (JSON) chooses the method and the server's settings:

- ``"method": "cascade"`` (default): a tiny HyFunc cascade whose retriever keeps every tool, so
  the small model always writes calls (several, templated); ``"refuse": true`` makes its
  retriever refuse every request, so the answer is a text reply from the large model;
- ``"method": "direct"``: direct prompting with the tiny model (answers are random text);
- ``"slow": seconds``: each answer waits that long first (the queue tests need a busy worker);
- ``"slow_steps": seconds``: each forward pass of the models waits that long first (a request of
  many steps, to give up midway);
- ``"library": true``: the cascade has a library retriever (reads libraries over 128 tools per function);
- ``"engine": "llamacpp"``: the cascade's two models are the real SmolLM2-135M GGUF on llama.cpp
  (random retriever and projector), as `--batch` needs;
- ``"HYFUNC_HOME": path``: the server's own home (its disk caches);
- any other key is a `ServeConfig` field (max_queue, api_key, max_body_bytes, ...).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from fastapi import FastAPI

from hyfunc.serving import ServeConfig, create_app
from tests.tiny_models import tiny_backend

SMALL_HIDDEN, LARGE_HIDDEN = 32, 48


def tiny_cascade(refuse: bool = False, library: bool = False, engine: str = "transformers") -> Any:
    """`library`: with a library retriever, so that libraries over 128 tools are read per function.
    `engine` "llamacpp": SmolLM2-135M on llama.cpp as both models instead of tiny random ones."""
    from hyfunc.methods.cascade import HyFuncMethod
    from hyfunc.cascade.retriever import Retriever, RetrieverConfig
    from hyfunc.cascade.small_model import SoftTokenProjector

    import torch

    torch.manual_seed(3)
    if engine == "llamacpp":
        from hyfunc.models.llamacpp import LlamaCppBackend

        large, small = LlamaCppBackend("smollm2-135m", n_ctx=8192), LlamaCppBackend("smollm2-135m", n_ctx=8192)
        hidden = large.hidden_size
        config = RetrieverConfig(query_dim=hidden, function_dim=hidden, proj_dim=8, threshold=-1.0, top_k=2, refusal_threshold=-1.0)
        return HyFuncMethod(large, small, Retriever(config).eval(), SoftTokenProjector(hidden, hidden))
    # threshold -1: every tool scores above it (cosines are >= -1); refusal above any cosine: refuse all.
    config = RetrieverConfig(query_dim=LARGE_HIDDEN, function_dim=LARGE_HIDDEN, proj_dim=8, threshold=-1.0, top_k=3,
                             refusal_threshold=2.0 if refuse else -1.0)
    projector = SoftTokenProjector(LARGE_HIDDEN, SMALL_HIDDEN)
    library_retriever = None
    if library:  # a BM25 part as the shipped one has; per-sentence queries
        library_config = RetrieverConfig(query_dim=LARGE_HIDDEN, function_dim=LARGE_HIDDEN, proj_dim=8, threshold=-1.0,
                                         top_k=3, lexical_weight=0.5, per_sentence=True)
        library_retriever = Retriever(library_config).eval()
    return HyFuncMethod(tiny_backend(LARGE_HIDDEN, seed=1), tiny_backend(SMALL_HIDDEN, seed=2), Retriever(config).eval(), projector,
                        library_retriever=library_retriever)


def slow_steps(backend: Any, seconds: float) -> None:
    """Every forward pass of `backend` waits `seconds` first, then runs as usual."""
    forward = backend.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return forward(*args, **kwargs)

    backend.forward = slow_forward


class Slow:
    """A method that waits before answering: makes the worker busy for the queue tests."""

    def __init__(self, method: Any, seconds: float):
        self.method, self.seconds = method, seconds
        self.name = method.name
        self.backend = getattr(method, "backend", None) or method.large

    def answer(self, messages: Any, tools: Any) -> Any:
        time.sleep(self.seconds)
        return self.method.answer(messages, tools)


def create() -> FastAPI:
    settings: dict[str, Any] = json.loads(os.environ.get("HYFUNC_TEST_SERVE", "{}"))
    kind = settings.pop("method", "cascade")
    refuse = settings.pop("refuse", False)
    slow = settings.pop("slow", 0)
    step_seconds = settings.pop("slow_steps", 0)
    if "HYFUNC_HOME" in settings:
        os.environ["HYFUNC_HOME"] = settings.pop("HYFUNC_HOME")
    if kind == "cascade":
        method = tiny_cascade(refuse, library=settings.pop("library", False), engine=settings.pop("engine", "transformers"))
    else:
        from hyfunc.methods.direct import DirectMethod

        method = DirectMethod(tiny_backend(SMALL_HIDDEN, seed=2), max_new_tokens=16)
    if step_seconds:
        for backend in {id(b): b for b in (getattr(method, "large", None), getattr(method, "small", None),
                                           getattr(method, "backend", None)) if b is not None}.values():
            slow_steps(backend, step_seconds)
    if slow:
        method = Slow(method, slow)
    # The tiny models' position table says 512, but their rotary embeddings extend: room for tests' tools.
    settings.setdefault("context_tokens", 4096)
    settings.setdefault("default_max_tokens", 12)
    return create_app(method, ServeConfig(**settings))
