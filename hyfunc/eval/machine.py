"""The code and the machine a report was made with (git commit, CPU and its speed flags).

Light on purpose (no torch): client-side benchmarks such as `hyfunc bench agent` record these
without loading a model library; `hyfunc.eval.provenance` adds the models and torch on top.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from hyfunc.config import cpu_flags

#: CPU flags that change the speed of transformers on a CPU (see models/backend.default_dtype):
#: AVX2 vs AVX-512 for fp32 matmuls, native bf16 (AVX512-BF16, AMX) for the bf16 default.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")

_REPO = Path(__file__).resolve().parents[2]


def git_state(repo: Path = _REPO) -> dict[str, Any]:
    """{"commit", "dirty"}; both None where there is no git or no repository (an installed wheel)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    # Untracked files do not change what ran; modified tracked files do.
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": bool(status.strip()) if status is not None else None}


def cpu_info() -> dict[str, Any]:
    """The CPU's name (from /proc/cpuinfo on Linux, where platform.processor() often says only
    "x86_64"), its core count and which of SPEED_FLAGS it has (None where flags are unknown)."""
    model = None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
            model = value
            break
    flags = cpu_flags() or None
    return {
        "model": model or platform.processor() or None,
        "cores": os.cpu_count(),
        "speed_flags": [f for f in SPEED_FLAGS if f in flags] if flags is not None else None,
    }
