"""Which traffic store a URL names, and opening it: the embedded SQLite file (the default) or
PostgreSQL. A module of its own: the stores import the interface in store.py, and this factory
imports the stores."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hyfunc.routing.store import StoreError, TrafficStore


def default_store_path() -> Path:
    from hyfunc.models.registry import hyfunc_home

    return hyfunc_home() / "traffic.sqlite"


def parse_store_url(url: str | Path | None) -> tuple[str, str | Path]:
    """("sqlite", Path) or ("postgresql", url). `None` -> the embedded SQLite file in $HYFUNC_HOME;
    `postgresql://...` -> PostgreSQL; `sqlite:///abs/path` or a plain file path -> SQLite.
    Raises StoreError (one line) for anything else."""
    if url is None:
        return "sqlite", default_store_path()
    text = str(url)
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("postgresql", "postgres"):
        return "postgresql", text
    if scheme == "sqlite":
        # sqlite:///abs/file.sqlite (SQLAlchemy's spelling) or sqlite://relative/file.sqlite
        path = text.split("://", 1)[1]
        if not path.strip("/"):
            raise StoreError(f"store URL {text!r} names no file (use sqlite:///absolute/path.sqlite)")
        return "sqlite", Path(path)
    if scheme:
        raise StoreError(f"unsupported store URL {text!r}: use a SQLite file path or postgresql://...")
    return "sqlite", Path(text)


def open_store(url: str | Path | None = None, **options: Any) -> TrafficStore:
    """Open (creating and migrating if needed) the store at `url`; see parse_store_url. Options:
    timeout (s), lazy (connect and migrate on first use), schema_target (tests of migrations)."""
    kind, where = parse_store_url(url)
    if kind == "postgresql":
        from hyfunc.routing.postgres_store import PostgresStore

        return PostgresStore(str(where), **options)
    from hyfunc.routing.sqlite_store import SQLiteStore

    return SQLiteStore(Path(where), **options)
