"""A trained part is a directory with a manifest.json (format, version, weights file, config): written
last, so a directory without one is an interrupted save, and checked when read."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hyfunc.durable import write_durably

MANIFEST = "manifest.json"


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    write_durably(directory / MANIFEST, json.dumps(manifest, indent=2))
    return directory


def read_manifest(directory: Path, fmt: str, version: int, what: str) -> dict[str, Any]:
    """The manifest of a saved `what` (e.g. "retriever"); FileNotFoundError / ValueError in one line."""
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {MANIFEST}; not a saved {what} (or an interrupted save)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != fmt or manifest.get("version") != version:
        raise ValueError(f"{path}: expected format {fmt!r} version {version}, got "
                         f"{manifest.get('format')!r} version {manifest.get('version')!r}")
    return manifest
