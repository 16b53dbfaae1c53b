"""Choosing and loading an engine for a model: transformers (reference, training) or llama.cpp."""
from __future__ import annotations

from pathlib import Path

import torch

from hyfunc.errors import InputError
from hyfunc.models.base import BackendBase

ENGINES: tuple[str, ...] = ("auto", "transformers", "llamacpp")
DEFAULT_ENGINE = "auto"


class EngineError(InputError):
    """An unknown engine, or one that cannot run here."""


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    return engine


def resolve_engine(engine: str, name: str, device: str | None = None) -> str:
    """"auto": llama.cpp wherever it can run the model (a default alias or a .gguf file, on the CPU,
    llama-cpp-python installed), transformers elsewhere (Hugging Face directories and ids, GPUs).
    Measured on our 2-core machines (reports/engines/): llama.cpp decoded 5-7x faster than
    transformers and its prefill was no slower, AVX2 and AMX machines alike."""
    check_engine(engine)
    if engine != "auto":
        return engine
    from hyfunc.models.llamacpp import llama_cpp_available
    from hyfunc.models.registry import DEFAULT_MODELS

    gguf = name in DEFAULT_MODELS or str(name).endswith(".gguf")
    return "llamacpp" if gguf and device in (None, "cpu") and llama_cpp_available() else "transformers"


def load_backend(
    name: str, engine: str = "auto", device: str | None = None, adapter: Path | None = None,
) -> BackendBase:
    """`name` (alias, path or hub id) on `engine`; `adapter`: a peft LoRA directory applied to it
    (merged on transformers; converted to a GGUF adapter, applied at load, on llama.cpp)."""
    engine = resolve_engine(engine, name, device)
    if engine == "llamacpp":
        if device not in (None, "cpu"):
            raise EngineError(f"the llama.cpp engine runs on the CPU here, not on {device!r}")
        from hyfunc.models.gguf_lora import cached_adapter_gguf
        from hyfunc.models.llamacpp import LlamaCppBackend
        from hyfunc.models.registry import resolve_gguf

        lora = cached_adapter_gguf(adapter, resolve_gguf(name)) if adapter is not None else None
        return LlamaCppBackend(name, lora=lora)
    from hyfunc.models.backend import Backend, default_dtype

    if adapter is None:
        return Backend(name, device=device)
    from peft import PeftModel

    backend = Backend(name, device=device, dtype=torch.float32)  # the adapter merges in fp32
    # Merged once at load: inference then runs a plain model, no adapter overhead. Then the
    # default precision (bf16 where matmuls are native; trained under bf16 autocast).
    backend.model = PeftModel.from_pretrained(backend.model, adapter).merge_and_unload().eval()
    backend.model.to(default_dtype(backend.device))
    return backend
