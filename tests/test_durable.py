"""Durable replacement (hyfunc.durable) and the version registry that relies on it: the new file
is whole, nothing temporary is left, and the file and then its directory reach the disk."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyfunc.durable import durable_replacement, write_durably
from hyfunc.routing.versions import Metrics, Versions


@pytest.fixture()
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inode numbers fsynced, in order (fsync still happens)."""
    inodes: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        inodes.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return inodes


def test_write_durably_replaces_whole_and_fsyncs_file_then_directory(tmp_path: Path, fsynced: list[int]) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    write_durably(target, '{"champion": "v2"}')
    assert target.read_text() == '{"champion": "v2"}'
    assert os.listdir(tmp_path) == ["state.json"]  # the temporary file was renamed, not left
    assert fsynced == [target.stat().st_ino, tmp_path.stat().st_ino]
    write_durably(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "aliases.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with durable_replacement(target) as temporary:
            temporary.write_text("half")
            raise RuntimeError("the writer failed")
    with pytest.raises(RuntimeError):
        with durable_replacement(tmp_path / "version") as temporary:
            (temporary / "sub").mkdir(parents=True)
            raise RuntimeError("the build failed")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["aliases.json"]


def test_a_directory_is_fsynced_entirely_before_its_rename(tmp_path: Path, fsynced: list[int]) -> None:
    target = tmp_path / "v1"
    with durable_replacement(target) as directory:
        (directory / "router").mkdir(parents=True)
        (directory / "router" / "router.json").write_text("{}")
        (directory / "manifest.json").write_text("{}")
    inode = lambda p: p.stat().st_ino  # noqa: E731
    files = {inode(target / "router" / "router.json"), inode(target / "manifest.json")}
    assert set(fsynced) == files | {inode(target / "router"), inode(target), inode(tmp_path)}
    assert fsynced.index(inode(target / "router" / "router.json")) < fsynced.index(inode(target / "router"))
    assert fsynced[-2:] == [inode(target), inode(tmp_path)]  # the tree, then the rename


def test_versions_and_aliases_are_written_durably(tmp_path: Path, fsynced: list[int]) -> None:
    versions = Versions(tmp_path / "odia")
    vid = versions.create(lambda d: (d / "router.json").write_text("{}"), metrics=Metrics(0.99, 0.5, 0.1), parents=[])
    version = versions.path(vid)
    assert {(version / "manifest.json").stat().st_ino, version.stat().st_ino,
            (tmp_path / "odia" / "versions").stat().st_ino} <= set(fsynced)
    fsynced.clear()
    versions.promote(vid)
    assert fsynced == [(tmp_path / "odia" / "aliases.json").stat().st_ino, (tmp_path / "odia").stat().st_ino]
    assert versions.champion == vid and sorted(os.listdir(tmp_path / "odia")) == ["aliases.json", "aliases.lock", "versions"]
    # A version a crash interrupted before its rename is not listed.
    stray = tmp_path / "odia" / "versions" / f".{vid}x.1234abcd.tmp"
    stray.mkdir()
    (stray / "manifest.json").write_text((version / "manifest.json").read_text())
    assert [m["id"] for m in versions.list()] == [vid]
