"""A directory of cache entries (one subdirectory each) bounded in bytes: least recently used out.

An entry's last use is its directory's modification time, set whenever it is held (`hold`, for
reading or writing); `trim` removes the least recently used entries until the rest fit. The entry
being used is never removed: a process holds it with a shared lock (flock) on the ``.lock`` file in
it, and `trim` removes only the entries it can lock exclusively without waiting, so an entry another
thread or process is writing or reading stays, whatever its age. POSIX only (flock).
"""
from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK = ".lock"  # in each entry's directory


def _lock(entry: Path, flags: int) -> int | None:
    """A descriptor of the entry's lock file, locked with `flags`; None when the entry is gone, or
    held elsewhere under LOCK_NB."""
    path = entry / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, flags)
        # `trim` may have removed the entry between our open and our lock.
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


@contextmanager
def hold(entry: Path) -> Iterator[Path]:
    """The entry's directory, created if missing and marked as used now; `trim` leaves it alone
    until the block ends."""
    while True:
        entry.mkdir(parents=True, exist_ok=True)
        fd = _lock(entry, fcntl.LOCK_SH)
        if fd is not None:
            break
    try:
        os.utime(entry)  # the last use, which `trim` orders by
        yield entry
    finally:
        os.close(fd)  # releases the lock


def entry_bytes(entry: Path) -> int:
    return sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())


def _usage(entry: Path) -> tuple[float, int] | None:
    """(last use, bytes) of an entry; None when another process's `trim` removed it meanwhile."""
    try:
        return entry.stat().st_mtime, entry_bytes(entry)
    except FileNotFoundError:
        return None


def trim(root: Path, max_bytes: int) -> list[str]:
    """Remove the least recently used entries under `root` until the rest take at most `max_bytes`,
    skipping those in use; the names removed."""
    if not root.is_dir():
        return []
    entries: list[tuple[float, int, Path]] = []
    for entry in root.iterdir():
        usage = _usage(entry) if entry.is_dir() and not entry.name.startswith(".") else None
        if usage is not None:
            entries.append((*usage, entry))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, entry in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes:
            break
        fd = _lock(entry, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            continue  # held (being written or read), or already gone
        try:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)
        total -= size
        removed.append(entry.name)
    return removed
