"""Settings read from the environment, in one place.

HYFUNC_HOME     where models are converted and caches live (default ~/.cache/hyfunc)
HYFUNC_DTYPE    float32 | bfloat16 | float16 for transformers models (default: by the CPU, see
                `hyfunc.models.backend.default_dtype`)
HYFUNC_THREADS  torch threads (default: torch's own choice)
BFCL_PROJECT_ROOT  where bfcl-eval writes its scratch folders (default $HYFUNC_HOME/bfcl; set in
                `hyfunc.formats.bfcl` before bfcl-eval is first imported)
"""
from __future__ import annotations

import os
from pathlib import Path


def hyfunc_home() -> Path:
    return Path(os.environ.get("HYFUNC_HOME", Path.home() / ".cache" / "hyfunc"))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where unknown): what decides dtypes and engines."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def threads() -> int | None:
    """HYFUNC_THREADS as a number of CPU threads for every engine (None: the engine's own choice)."""
    from hyfunc.errors import InputError

    value = os.environ.get("HYFUNC_THREADS")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"HYFUNC_THREADS={value!r}: use a positive number of threads")
    return int(value)
