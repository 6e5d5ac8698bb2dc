"""`SqliteStore`: the embedded default, one WAL-mode SQLite file shared by tasks and processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite

from runtime.storage.dialect import Dialect
from runtime.storage.sql import SqlStore
from runtime.storage.sql_core import Conn
from runtime.storage.sql_rows import Row

_PLACEHOLDER = re.compile(r"\$(\d+)")
_TRANSIENT_MESSAGES = ("database is locked", "database table is locked", "database is busy")


@functools.lru_cache(maxsize=512)
def to_sqlite(sql: str) -> str:
    """`$1` -> `?1`: SQLite's numbered parameters bind the same argument list as asyncpg's."""
    return _PLACEHOLDER.sub(r"?\1", sql)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(message in text for message in _TRANSIENT_MESSAGES)
    return False


SQLITE = Dialect(
    name="sqlite",
    now_sql="((julianday('now') - 2440587.5) * 86400.0)",
    # The write transaction is BEGIN IMMEDIATE (`SqlitePool`): it holds the database lock.
    thread_lock="",
    is_transient=_is_transient,
    render=to_sqlite,
    # SQLite has no octet_length before 3.43: a TEXT cast to BLOB measures its UTF-8 bytes.
    octets=lambda expression: f"length(CAST({expression} AS BLOB))",
    # julianday('now') is the machine's wall clock, which time.time() reads without a query.
    local_clock=time.time,
)


def _dict_row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, values, strict=True)}


def split_script(script: str) -> list[str]:
    """Statements of a migration script; executescript() would commit the open transaction."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    # A last statement may lack its semicolon; trailing comments are not a statement.
    if any(line.strip() and not line.strip().startswith("--") for line in buffer.splitlines()):
        statements.append(buffer.strip())
    return statements


def _ensure_parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


class _SqliteConn(Conn):
    def __init__(self, db: aiosqlite.Connection) -> None:
        super().__init__(SQLITE)
        self._db = db

    async def execute(self, sql: str, *args: Any) -> None:
        await self._db.execute_fetchall(self.dialect.render(sql), args)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        # Fetching every row also completes RETURNING statements before the next one runs.
        rows = await self._db.execute_fetchall(self.dialect.render(sql), args)
        # aiosqlite's Row is a mapping by column name (row_factory), which is what Row means.
        return list(rows)  # type: ignore[arg-type]

    async def run_script(self, script: str) -> None:
        for statement in split_script(script):
            await self._db.execute_fetchall(statement)


class SqlitePool:
    """One connection, serialised by an asyncio lock; other processes on the same file wait on
    SQLite's own lock (busy_timeout) and then get retried."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    @property
    def is_open(self) -> bool:
        return self._db is not None

    async def open(self) -> None:
        if self._db is not None:
            return
        await asyncio.to_thread(_ensure_parent, self.path)
        db = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            db.row_factory = _dict_row  # type: ignore[assignment]
            await db.execute_fetchall(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            await db.execute_fetchall("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode (only an OS crash can
            # lose the last commits), and much faster than FULL.
            await db.execute_fetchall("PRAGMA synchronous = NORMAL")
            await db.execute_fetchall("PRAGMA foreign_keys = ON")
        except BaseException:
            await db.close()
            raise
        self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            async with self._lock:
                await db.close()

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[Conn]:
        db = self._db
        if db is None:
            raise RuntimeError("SqliteStore is not open")
        async with self._lock:
            try:
                # IMMEDIATE takes the write lock up front: a deferred transaction that later
                # writes could fail with SQLITE_BUSY_SNAPSHOT after having read stale data.
                await db.execute_fetchall("BEGIN IMMEDIATE" if write else "BEGIN")
                yield _SqliteConn(db)
                await db.execute_fetchall("COMMIT")
            except BaseException:
                await _rollback(db)
                raise


async def _rollback(db: aiosqlite.Connection) -> None:
    """Leave the shared connection outside any transaction, even for a cancelled caller.

    aiosqlite runs statements in order on its own thread, so a ROLLBACK queued now also undoes
    a BEGIN whose caller was cancelled while it was still executing.
    """

    async def rollback() -> None:
        # OperationalError: no transaction was open (BEGIN failed or COMMIT went through).
        with contextlib.suppress(sqlite3.OperationalError):
            await db.execute_fetchall("ROLLBACK")

    task = asyncio.ensure_future(rollback())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # Hold the store lock until the rollback ran, then let the cancellation through.
        await task
        raise


class SqliteStore(SqlStore):
    """`SqlStore` over the SQLite dialect and one shared connection to the file at `path`."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        self.path = os.fspath(path)
        self.busy_timeout_ms = busy_timeout_ms
        super().__init__(SQLITE, SqlitePool(self.path, busy_timeout_ms))


__all__ = ["SQLITE", "SqlitePool", "SqliteStore"]
