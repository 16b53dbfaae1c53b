"""The bounded on-disk cache (hyfunc.disk_cache) and the per-function library embeddings kept in it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyfunc.cascade.library import embeddings_stored, library_embeddings
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.disk_cache import entry_bytes, hold, trim
from hyfunc.formats.schema import parse_tools
from tests.tiny_models import tiny_backend


def _entry(root: Path, name: str, used: float) -> Path:
    """An entry of 100 bytes, last used at `used` (seconds since the epoch)."""
    with hold(root / name) as entry:
        (entry / "data").write_bytes(b"x" * 100)
    os.utime(entry, (used, used))
    return entry


def test_the_least_recently_used_entry_goes_and_a_recently_read_one_stays(tmp_path: Path) -> None:
    a, b, c = (_entry(tmp_path, name, used) for name, used in (("a", 1000), ("b", 2000), ("c", 3000)))
    with hold(a):  # a read: the oldest entry becomes the most recently used
        pass
    assert trim(tmp_path, 250) == ["b"]
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert trim(tmp_path, 250) == []  # within the bound: nothing more goes


def test_an_entry_in_use_is_never_removed(tmp_path: Path) -> None:
    old, new = _entry(tmp_path, "old", 1000), _entry(tmp_path, "new", 2000)
    with hold(old):
        os.utime(old, (1000, 1000))  # still the least recently used, but held (being written or read)
        assert trim(tmp_path, 0) == ["new"]
    assert old.is_dir() and entry_bytes(old) == 100
    assert trim(tmp_path, 0) == ["old"]  # released: now it may go


def test_library_embeddings_keep_the_disk_cache_within_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path))
    encoder = SoftTokenEncoder(tiny_backend(hidden_size=16, seed=1))
    first, second = ([{"name": f"{prefix}_{i}", "description": f"tool {i}"} for i in range(3)] for prefix in ("f", "g"))
    first, second = parse_tools(first), parse_tools(second)
    embedded = library_embeddings(encoder, first)
    assert embeddings_stored(encoder, first) and not embeddings_stored(encoder, second)
    root = tmp_path / "library-embeddings"
    one_library = sum(entry_bytes(e) for e in root.iterdir() if e.is_dir())
    library_embeddings(encoder, second, max_bytes=one_library)  # room for one: the older library goes
    assert embeddings_stored(encoder, second) and not embeddings_stored(encoder, first)
    assert library_embeddings(encoder, first, max_bytes=0).allclose(embedded)  # computed again; the newest always stays
    assert [e.is_dir() for e in root.iterdir()].count(True) == 1
