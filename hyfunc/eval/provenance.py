"""What produced a report, recorded in every one of them (BFCL runs, the library and retrieval
benchmarks): the code (git commit, dirty tree), the trained artifact (its manifest's sha256), the
models (the GGUF sha256 the registry verifies for default models) and the machine (CPU, the flags
that decide its speed, torch's dtype and threads). Numbers without these cannot be compared."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from hyfunc.cascade.manifest import MANIFEST
from hyfunc.eval.machine import cpu_info, git_state
from hyfunc.models.registry import DEFAULT_MODELS


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _backends(method: Any) -> dict[str, Any]:
    """role -> loaded Backend of a method (the cascade's large and small model, direct's model)."""
    found = {role: getattr(method, role, None) for role in ("large", "small", "backend")}
    return {role: b for role, b in found.items() if b is not None}


def model_record(backend: Any) -> dict[str, Any]:
    spec = DEFAULT_MODELS.get(backend.name)
    model = getattr(backend, "model", None)
    gguf = getattr(backend, "gguf_path", None)
    return {
        "name": backend.name,
        # The registry checks the assembled GGUF against this value before converting it.
        "gguf_sha256": spec.sha256 if spec is not None else None,
        "upstream": spec.upstream if spec is not None else None,
        # llama.cpp runs a GGUF file's own quantisation (the shipped Q4_K_M, or a requantized copy): no torch dtype.
        "dtype": str(model.dtype).removeprefix("torch.") if model is not None else f"gguf {gguf.name if gguf else ''}".strip(),
        "engine": getattr(backend, "engine", None),
        "description": getattr(backend, "description", None),
        "device": str(backend.device),
    }


def provenance(methods: Iterable[Any] = ()) -> dict[str, Any]:
    """The provenance of a report made with `methods` (any objects; cascades and direct methods
    contribute their artifact and models)."""
    record: dict[str, Any] = {
        "git": git_state(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_info(),
        "env": {k: os.environ[k] for k in ("HYFUNC_DTYPE", "HYFUNC_THREADS") if k in os.environ},
        "artifacts": {},
        "models": {},
    }
    for method in methods:
        artifact = getattr(method, "artifact", None)
        if artifact is not None and (Path(artifact) / MANIFEST).is_file():
            record["artifacts"][str(artifact)] = {"manifest_sha256": file_sha256(Path(artifact) / MANIFEST)}
        for role, backend in _backends(method).items():
            record["models"].setdefault(backend.name, {**model_record(backend), "roles": []})["roles"].append(
                f"{getattr(method, 'name', type(method).__name__)}:{role}"
            )
    return record


def provenance_markdown(record: dict[str, Any] | None) -> str:
    """One line for a report's markdown header."""
    if not record:
        return "Provenance: not recorded (a report from before provenance was kept)."
    git = record.get("git", {})
    commit = (git.get("commit") or "no git")[:10] + (" (dirty tree)" if git.get("dirty") else "")
    cpu = record.get("cpu", {})
    flags = ", ".join(cpu.get("speed_flags") or []) or "none of avx2/avx512"
    models = "; ".join(
        f"{name} {m.get('dtype')}" + (f" (GGUF sha256 {m['gguf_sha256'][:12]}…)" if m.get("gguf_sha256") else "")
        for name, m in record.get("models", {}).items()
    )
    artifacts = "; ".join(f"{Path(path).name} manifest sha256 {a['manifest_sha256'][:12]}…" for path, a in record.get("artifacts", {}).items())
    parts = [f"commit {commit}", f"{cpu.get('model')} × {cpu.get('cores')} cores ({flags}), torch {record.get('torch')} "
             f"with {record.get('torch_threads')} threads"]
    parts += [p for p in (models, artifacts) if p]
    return "Provenance: " + "; ".join(parts) + "."
