"""Replacing a file (or a directory) so that a crash or a power cut leaves the old one or the new
one, whole: written beside its target, fsynced, renamed over it, then the directory fsynced.

The rename alone is atomic for readers (a server polling the champion alias sees the old file or
the new one) but not durable: after a power cut the directory may still name the old file, or the
new name may point at data never flushed to disk (an empty file).
"""
from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def durable_replacement(target: str | Path) -> Iterator[Path]:
    """A temporary path beside `target` for the caller to write, by any means (a file, or a
    directory tree); on a normal exit it is fsynced and renamed over `target` and the directory
    fsynced, on an error it is removed and `target` is left as it was."""
    target = Path(target)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield temporary
        _fsync_tree(temporary)
        os.replace(temporary, target)
    except BaseException:
        if temporary.is_dir() and not temporary.is_symlink():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            temporary.unlink(missing_ok=True)
        raise
    _fsync(target.parent)  # the rename itself


def write_durably(path: str | Path, data: str | bytes) -> None:
    """Replace the file at `path` with `data` (text is written as UTF-8)."""
    with durable_replacement(path) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def _fsync_tree(path: Path) -> None:
    # Contents before the directory naming them: the rename must never publish unflushed data.
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _fsync_tree(child)
    if not path.is_symlink():
        _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
