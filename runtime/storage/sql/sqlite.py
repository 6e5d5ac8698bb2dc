"""`SqliteStore`: the embedded default, one WAL-mode SQLite file shared by tasks and processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from runtime.storage.sql.core import Conn
from runtime.storage.sql.dialect import Dialect
from runtime.storage.sql.rows import Row
from runtime.storage.sql.sql_store import SqlStore

log = logging.getLogger(__name__)

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
    # COMMIT either returns or fails with the transaction rolled back (`SqlitePool`).
    commit_outcome_known=True,
)


def _rows(cursor: sqlite3.Cursor) -> list[Row]:
    """Every row of an executed statement as a dict by column name (what `Row` means)."""
    values = cursor.fetchall()
    if not values:
        return []
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in values]


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
    """Statements run on the event loop's thread: a local file answers in microseconds, less
    than a hop to a driver thread costs (each hop wakes a thread and contends for the GIL).
    Waiting for another process's lock is the one slow thing, and it is never done here:
    `SqlitePool` takes the lock before the transaction starts, without blocking the loop."""

    def __init__(self, db: sqlite3.Connection) -> None:
        super().__init__(SQLITE)
        self._db = db

    async def execute(self, sql: str, *args: Any) -> None:
        # Fetching every row also completes RETURNING statements before the next one runs.
        self._db.execute(self.dialect.render(sql), args).fetchall()

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return _rows(self._db.execute(self.dialect.render(sql), args))

    async def run_script(self, script: str) -> None:
        for statement in split_script(script):
            self._db.execute(statement).fetchall()


class SqlitePool:
    """One connection, serialised by an asyncio lock. Another process holding the file's write
    lock is waited for here, asynchronously, for up to `busy_timeout_ms` (the connection's own
    busy timeout is 0, so no statement ever blocks the loop waiting); then the transaction
    fails as transient and the store retries it.

    WAL checkpoints (copying the log into the database file, with an fsync) would block the
    loop for milliseconds if SQLite ran them at COMMIT, as it does by default: automatic
    checkpoints are off on this connection, and every `CHECKPOINT_EVERY` write transactions a
    PASSIVE checkpoint runs on a thread of its own, on a connection of its own (it never
    blocks writers or readers)."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._writes = 0
        self._checkpoint: asyncio.Future[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    async def open(self) -> None:
        if self._db is not None:
            return
        await asyncio.to_thread(_ensure_parent, self.path)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout = 0")
            db.execute("PRAGMA journal_mode = WAL").fetchall()
            # NORMAL is durable across application crashes in WAL mode (only an OS crash can
            # lose the last commits), and much faster than FULL.
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            db.close()
            raise
        self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            async with self._lock:
                if self._checkpoint is not None:
                    await self._checkpoint
                db.close()

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[Conn]:
        db = self._db
        if db is None:
            raise RuntimeError("SqliteStore is not open")
        async with self._lock:
            # IMMEDIATE takes the write lock up front: a deferred transaction that later
            # writes could fail with SQLITE_BUSY_SNAPSHOT after having read stale data.
            await self._begin(db, "BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                conn = _SqliteConn(db)
                yield conn
                db.execute("COMMIT")
                conn.committed = True
            except BaseException:
                _rollback(db)
                raise
        if write:
            self._writes += 1
            if self._writes % CHECKPOINT_EVERY == 0 and (
                self._checkpoint is None or self._checkpoint.done()
            ):
                self._checkpoint = asyncio.ensure_future(asyncio.to_thread(_checkpoint, self.path))

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Conn]:
        """Statements in autocommit mode, each its own read transaction (one snapshot per
        statement: what `Pool.statements` promises), under the connection's lock: no BEGIN
        and COMMIT to run."""
        db = self._db
        if db is None:
            raise RuntimeError("SqliteStore is not open")
        async with self._lock:
            yield _SqliteConn(db)

    def autocommit(self) -> AbstractAsyncContextManager[Conn]:
        # A write takes the lock up front (BEGIN IMMEDIATE), as every write here does.
        return self.transaction(write=True)

    async def _begin(self, db: sqlite3.Connection, begin: str) -> None:
        # The lock is free unless another process writes: the clock is read only then.
        loop: asyncio.AbstractEventLoop | None = None
        deadline = pause = 0.0
        while True:
            try:
                db.execute(begin)
                return
            except sqlite3.OperationalError as exc:
                if not _is_transient(exc):
                    raise
                if loop is None:
                    loop = asyncio.get_running_loop()
                    deadline, pause = loop.time() + self.busy_timeout_ms / 1000, 0.001
                if loop.time() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)


# Write transactions between two WAL checkpoints (a few pages each: about SQLite's own
# threshold of 1 000 pages).
CHECKPOINT_EVERY = 200


def _checkpoint(path: str) -> None:
    """A PASSIVE checkpoint on a short-lived connection (run on a worker thread). A failure
    only lets the WAL grow until the next one: logged, never raised."""
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            db.close()
    except Exception as exc:  # sqlite3.Error, OSError: the next checkpoint tries again
        log.warning("SQLite WAL checkpoint of %s failed: %s", path, exc)


def _rollback(db: sqlite3.Connection) -> None:
    """Leave the shared connection outside any transaction (synchronous: nothing can cancel
    it half-way, and the store lock is still held)."""
    # OperationalError: no transaction was open (COMMIT went through, or failed and ended it).
    with contextlib.suppress(sqlite3.OperationalError):
        db.execute("ROLLBACK")


class SqliteStore(SqlStore):
    """`SqlStore` over the SQLite dialect and one shared connection to the file at `path`."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        self.path = os.fspath(path)
        self.busy_timeout_ms = busy_timeout_ms
        super().__init__(SQLITE, SqlitePool(self.path, busy_timeout_ms))


__all__ = ["SQLITE", "SqlitePool", "SqliteStore"]
