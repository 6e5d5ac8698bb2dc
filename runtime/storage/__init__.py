"""Durable storage: the `Store` interface, its SQLite and Postgres backends, and `open_store`."""

from __future__ import annotations

from runtime.storage.sql.postgres import PostgresStore
from runtime.storage.sql.sql_store import SqlStore
from runtime.storage.sql.sqlite import SqliteStore
from runtime.storage.store import Store


def open_store(url: str) -> SqlStore:
    """The store for a database URL, not yet opened: `await store.open()` or `async with`.

    `sqlite:///relative/path.db` and `sqlite:////absolute/path.db` (as SQLAlchemy spells them),
    `postgresql://…` or `postgres://…` (passed to asyncpg unchanged).
    """
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()
    if separator and scheme in ("postgresql", "postgres"):
        return PostgresStore(url)
    if separator and scheme == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        path = path.split("?", 1)[0]
        if not path:
            raise ValueError(f"sqlite URL without a path: {url!r}")
        return SqliteStore(path)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


__all__ = ["PostgresStore", "SqlStore", "SqliteStore", "Store", "open_store"]
