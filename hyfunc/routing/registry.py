"""Router versions in PostgreSQL, shared by every replica (see `versions.py` for what a version is).

Several `hyfunc serve` processes, on one machine or many, read the champion from the same
database; an ODIA cycle run anywhere writes its versions there. The tables come with the traffic
store's migrations (`postgres_store.MIGRATIONS`, version 3), so one database holds both:

- `versions`: each version's manifest and its files, as relative path -> SHA-256;
- `version_files`: the files' bytes by SHA-256 (content-addressed: a file shared by versions is
  stored once, and a replica checks every byte it reads);
- `version_aliases`: one row, the champion and the stack of earlier champions. Promotion and
  rollback lock it (`SELECT ... FOR UPDATE`), change it and commit: never a lost update.

A replica copies a version's files into its local cache (`$HYFUNC_HOME/versions-cache/<id>`, an
atomic rename, so a concurrent reader sees the whole version or none) the first time it loads it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Callable

from hyfunc.config import hyfunc_home
from hyfunc.durable import durable_replacement
from hyfunc.routing.postgres_store import PostgresStore
from hyfunc.routing.versions import (
    Metrics,
    Versions,
    VersionError,
    VersionStore,
    new_version_id,
    promoted,
    rolled_back,
    version_manifest,
)

URL_SCHEMES = ("postgresql://", "postgres://")
_ALIASES = "SELECT champion, history FROM version_aliases WHERE name = 'main'"


def is_registry_url(location: str | Path) -> bool:
    return str(location).startswith(URL_SCHEMES)


def open_versions(location: str | Path, cache_dir: Path | None = None) -> VersionStore:
    """The versions at `location`: a PostgreSQL URL (replicas) or a directory (one machine)."""
    if is_registry_url(location):
        return PostgresVersions(str(location), cache_dir)
    return Versions(location)


def _file_hashes(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _safe_relative(path: str) -> PurePosixPath:
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise VersionError(f"a version file has an unsafe path {path!r}")
    return relative


class PostgresVersions(VersionStore):
    def __init__(self, url: str, cache_dir: Path | None = None) -> None:
        self.store = PostgresStore(url, max_size=2)
        self.url = self.store.url  # without the password
        self.cache = Path(cache_dir) if cache_dir is not None else hyfunc_home() / "versions-cache"
        self.cache.mkdir(parents=True, exist_ok=True)
        self.scratch = self.cache / "work"

    def __str__(self) -> str:
        return self.url

    def close(self) -> None:
        self.store.close()

    # -- versions ----------------------------------------------------------------------------
    def create(self, build: Callable[[Path], None], *, metrics: Metrics, parents: list[str],
               window: dict | None = None, note: str = "") -> str:
        vid = new_version_id()
        manifest = version_manifest(vid, metrics, parents, window, note)
        # The local copy is published only once the database has the version: a failed upload
        # leaves neither.
        with durable_replacement(self.cache / vid) as directory:
            directory.mkdir()
            build(directory)
            (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
            files = _file_hashes(directory)
            with self.store.transaction() as cur:
                for relative, sha in files.items():
                    cur.execute("INSERT INTO version_files (sha256, data) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                (sha, (directory / relative).read_bytes()))
                cur.execute("INSERT INTO versions (id, created, manifest, files) VALUES (%s, %s, %s, %s)",
                            (vid, manifest["created"], json.dumps(manifest), json.dumps(files)))
        return vid

    def path(self, vid: str) -> Path:
        local = self.cache / vid
        if (local / "manifest.json").is_file():
            return local
        with self.store.transaction() as cur:
            cur.execute("SELECT files FROM versions WHERE id = %s", (vid,))
            row = cur.fetchone()
            if row is None:
                raise VersionError(f"no version {vid!r} in {self.url}")
            files = json.loads(row[0])
            cur.execute("SELECT sha256, data FROM version_files WHERE sha256 = ANY(%s)", (sorted(set(files.values())),))
            blobs = {sha: bytes(data) for sha, data in cur.fetchall()}
        try:
            with durable_replacement(local) as directory:
                for relative, sha in files.items():
                    data = blobs.get(sha)
                    if data is None or hashlib.sha256(data).hexdigest() != sha:
                        raise VersionError(f"version {vid}: {relative} is missing or corrupt in {self.url}")
                    target = directory / _safe_relative(relative)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
        except OSError:
            if not (local / "manifest.json").is_file():  # else another process copied it first
                raise
        return local

    def manifest(self, vid: str) -> dict:
        with self.store.transaction() as cur:
            cur.execute("SELECT manifest FROM versions WHERE id = %s", (vid,))
            row = cur.fetchone()
        if row is None:
            raise VersionError(f"no version {vid!r} in {self.url}")
        return json.loads(row[0])

    def list(self) -> list[dict]:
        with self.store.transaction() as cur:
            cur.execute("SELECT manifest FROM versions ORDER BY created, id")
            return [json.loads(row[0]) for row in cur.fetchall()]

    # -- aliases -----------------------------------------------------------------------------
    def aliases(self) -> dict:
        with self.store.transaction() as cur:
            cur.execute(_ALIASES)
            champion, history = cur.fetchone()
        return {"champion": champion, "history": json.loads(history)}

    def _change_aliases(self, change: Callable[[dict], dict], vid: str | None = None) -> dict:
        with self.store.transaction() as cur:
            cur.execute(_ALIASES + " FOR UPDATE")
            champion, history = cur.fetchone()
            if vid is not None:
                cur.execute("SELECT 1 FROM versions WHERE id = %s", (vid,))
                if cur.fetchone() is None:
                    raise VersionError(f"no version {vid!r} in {self.url}")
            aliases = change({"champion": champion, "history": json.loads(history)})
            cur.execute("UPDATE version_aliases SET champion = %s, history = %s, "
                        "updated = EXTRACT(EPOCH FROM clock_timestamp()) WHERE name = 'main'",
                        (aliases["champion"], json.dumps(aliases["history"])))
        return aliases

    def promote(self, vid: str) -> None:
        self._change_aliases(lambda aliases: promoted(aliases, vid), vid)

    def rollback(self) -> str:
        return self._change_aliases(rolled_back)["champion"]
