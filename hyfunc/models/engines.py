"""Choosing and loading an engine for a model: transformers (reference, training) or llama.cpp."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hyfunc.errors import InputError

if TYPE_CHECKING:  # torch loads with the backends, not with the engine names the command line reads
    from hyfunc.models.base import BackendBase

ENGINES: tuple[str, ...] = ("auto", "transformers", "llamacpp")
DEFAULT_ENGINE = "auto"


class EngineError(InputError):
    """An unknown engine, or one that cannot run here."""


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    return engine


#: Roles a model plays: in the cascade ("large" reads the prompt once, "small" decodes the calls)
#: or alone ("direct": prefill and decode of the whole answer).
ROLES = ("large", "small", "direct")


def resolve_engine(engine: str, name: str, device: str | None = None, role: str = "direct") -> str:
    """The engine that "auto" stands for, by measurement (reports/engines/):

    - llama.cpp runs only GGUF models (default aliases, .gguf files) on the CPU; anything else
      (Hugging Face directories and ids, GPUs) runs on transformers.
    - CPUs with AMX (bf16 matrix tiles): transformers bf16 read a BFCL prompt 3.5x faster than
      llama.cpp (1.72 vs 5.95 s per case, 1.5B) and the cascade's small model passes were no slower
      (0.65 vs 1.44 s), while llama.cpp decoded 3.2x faster (2.08 vs 6.75 s). So the cascade's
      stages run on transformers, and direct prompting, which decodes whole answers, on llama.cpp
      (8.0 vs 8.5 s per case).
    - Other CPUs (AVX2/AVX-512 without AMX, float32 in torch): llama.cpp for every role; it read
      prompts 1.4x and decoded 6-7x faster than transformers on the AVX2 machine of issue 19.
    """
    check_engine(engine)
    if engine != "auto":
        return engine
    from hyfunc.config import cpu_flags
    from hyfunc.models.llamacpp import llama_cpp_available
    from hyfunc.models.registry import DEFAULT_MODELS

    gguf = name in DEFAULT_MODELS or str(name).endswith(".gguf")
    if not (gguf and device in (None, "cpu") and llama_cpp_available()):
        return "transformers"
    if role in ("large", "small") and "amx_bf16" in cpu_flags():
        return "transformers"
    return "llamacpp"


def load_backend(
    name: str, engine: str = "auto", device: str | None = None, adapter: Path | None = None, role: str = "direct",
) -> BackendBase:
    """`name` (alias, path or hub id) on `engine`; `adapter`: a peft LoRA directory applied to it
    (merged into the weights on either engine)."""
    engine = resolve_engine(engine, name, device, role)
    if engine == "llamacpp":
        if device not in (None, "cpu"):
            raise EngineError(f"the llama.cpp engine runs on the CPU here, not on {device!r}")
        from hyfunc.models.gguf_lora import cached_merged_gguf
        from hyfunc.models.llamacpp import LlamaCppBackend, engine_gguf

        merged = cached_merged_gguf(adapter, engine_gguf(name)) if adapter is not None else None
        return LlamaCppBackend(name, gguf=merged)
    import torch

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
