"""Connections, transactions, retries and migrations for SQL backends; the thread lock and bump."""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from runtime import instruments
from runtime.errors import NotFound, Unavailable
from runtime.storage.sql.dialect import Dialect
from runtime.storage.sql.rows import Row
from runtime.storage.thread_query import read_cursor

T = TypeVar("T")

log = logging.getLogger(__name__)


# The column `Conn.now_column` adds to a SELECT.
NOW_COLUMN = "now_"


class Conn(abc.ABC):
    """One connection inside one transaction. The shared SQL uses `$n` placeholders; the
    dialect renders them for the driver.

    Also carries per-transaction state: the database time (read once, after the thread lock,
    so every check in the transaction uses the same instant), the version bumps done (at most
    one per thread) and telemetry to emit only once the transaction committed.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._now: float | None = None
        self.bumped: dict[str, int] = {}
        self.after_commit: list[Callable[[], None]] = []
        # The thread whose row lock the transaction's first round trip took already (with its
        # BEGIN and key claim, `keys_tx.claim`); None: the transaction takes it itself.
        self.locked: str | None = None
        # Thread versions read under this transaction's thread lock (`note_version`).
        self.versions: dict[str, int] = {}
        # Set by a pool whose COMMIT outcome is always known (`Dialect.commit_outcome_known`)
        # once COMMIT went through.
        self.committed = False

    @abc.abstractmethod
    async def execute(self, sql: str, *args: Any) -> None: ...

    @abc.abstractmethod
    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    @abc.abstractmethod
    async def run_script(self, script: str) -> None:
        """Run several `;`-separated statements (migrations) inside the current transaction."""

    async def execute_later(self, sql: str, *args: Any) -> None:
        """A write whose outcome nothing in between depends on: run now here. A backend may
        hold it until just before the transaction's next statement (so every later statement
        sees it) or send it inside `fetch_with_pending`'s statement: fewer round trips."""
        await self.execute(sql, *args)

    async def fetch_with_pending(self, sql: str, *args: Any) -> list[Row]:
        """`fetch`, carrying the writes `execute_later` holds, where the backend holds any, in
        the same round trip. `sql` must read none of the rows those writes change."""
        return await self.fetch(sql, *args)

    def defer_unique(self, constraint: str, error: Exception) -> bool:
        """Where the backend can let the database check a unique `constraint` when the writes
        reach it, held or not (raising `error` instead of the violation, what the transaction
        or statement wrote rolled back), register that and return True: the caller reads
        nothing to check first. False: the caller checks now."""
        return False

    async def lock(self, sql: str, *args: Any) -> None:
        """Run `sql`, a statement that takes a lock and reads and writes no table (an advisory
        lock), carrying the writes `execute_later` holds in its round trip where the backend
        holds any: they are made by the time it returns, as after `execute`."""
        await self.execute(sql, *args)

    async def first_statement(self, sql: str) -> str | None:
        """Run `sql` (no parameters) as the transaction's first statement, in one round trip
        with its BEGIN, and return its command status (`INSERT 0 1`), where the backend sends
        BEGIN lazily and nothing ran yet; None otherwise (nothing ran: use `fetch`)."""
        return None

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return None if row is None else next(iter(row.values()))

    async def now(self) -> float:
        if self._now is None:
            clock = self.dialect.local_clock
            if clock is not None:
                self._now = clock()
            else:
                self._now = float(await self.fetchval(f"SELECT {self.dialect.now_sql} AS now"))
        return self._now

    def now_expression(self, index: int) -> tuple[str, list[Any]]:
        """The transaction's clock as SQL for a statement whose next parameter is `$index`: the
        clock `now()` reads where the dialect reads it in-process (a parameter, so it agrees
        with what such writes stored), else the dialect's clock in the statement itself (no
        round trip to read it first)."""
        if self._now is not None:
            return f"${index}", [self._now]
        clock = self.dialect.local_clock
        if clock is not None:
            return f"${index}", [clock()]
        return self.dialect.now_sql, []

    def now_column(self) -> str:
        """`, <now_sql> AS now_` for a SELECT list: the statement also reads the clock (one
        round trip fewer) while the transaction has not read it yet and the dialect needs a
        query for it; pass the row to `take_now`. Empty otherwise."""
        if self._now is not None or self.dialect.local_clock is not None:
            return ""
        return f", {self.dialect.now_sql} AS {NOW_COLUMN}"

    def take_now(self, row: Row | None) -> None:
        """Keep the clock a `now_column` statement read, as `now()` from then on."""
        if self._now is None and row is not None and NOW_COLUMN in row:
            self._now = float(row[NOW_COLUMN])

    def on_commit(self, callback: Callable[[], None]) -> None:
        self.after_commit.append(callback)

    def note_version(self, thread_id: str, version: int) -> None:
        """The thread's version as a statement read it after this transaction locked the thread
        row: nothing else changes it until COMMIT, so `bump` knows the next one without asking
        (on Postgres its UPDATE is then held, to go with COMMIT)."""
        self.versions[thread_id] = version


class Pool(Protocol):
    """A backend's connections: `transaction` yields a `Conn` inside BEGIN … COMMIT, rolls back
    on any exception (a cancellation too) and, for `write`, holds whatever lock the dialect's
    `thread_lock` does not take."""

    @property
    def is_open(self) -> bool: ...
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Conn]: ...
    def statements(self) -> AbstractAsyncContextManager[Conn]:
        """A connection outside any transaction, for reads whose statements are each
        consistent on their own (no BEGIN and COMMIT round trips)."""
        ...

    def autocommit(self) -> AbstractAsyncContextManager[Conn]:
        """A connection for one write statement that is atomic and idempotent on its own: it
        commits by itself where that saves round trips (Postgres), else in a write
        transaction."""
        ...


TxFn = Callable[[Conn], Awaitable[T]]


# --- retries ------------------------------------------------------------------------------


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    *,
    backend: str,
    is_transient: Callable[[BaseException], bool],
    attempts: int,
    initial_wait: float,
    max_wait: float,
    budget: float,
) -> T:
    """Run `fn` with backoff on transient errors; `Unavailable` once `attempts` are used up or
    `budget` seconds have passed since the first attempt, whichever comes first.

    The first attempt runs directly: the retry machinery (a per-call object graph) is built only
    once an attempt failed transiently, so a call that succeeds costs nothing more than `fn`."""
    started = time.monotonic()
    try:
        return await fn()
    except Exception as exc:
        if not is_transient(exc):
            raise
        first = exc
    instruments.safe_add(instruments.STORAGE_RETRIES, 1, {"backend": backend})
    if attempts <= 1 or time.monotonic() - started >= budget:
        raise _unavailable(backend, 1, first) from first
    # The backoff schedule continues where the first attempt left it: initial_wait after it,
    # then doubling (`wait_exponential` of the later attempts starts at twice the first wait).
    await asyncio.sleep(min(initial_wait, max_wait) + random.uniform(0, initial_wait))

    def count(state: RetryCallState) -> None:
        instruments.safe_add(instruments.STORAGE_RETRIES, 1, {"backend": backend})

    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts - 1)
        | stop_after_delay(max(budget - (time.monotonic() - started), 0.0)),
        # Exponential backoff plus jitter, so processes that collided do not collide again.
        wait=wait_exponential(multiplier=initial_wait * 2, max=max_wait)
        + wait_random(0, initial_wait),
        retry=retry_if_exception(is_transient),
        before_sleep=count,
        reraise=False,
    )
    try:
        async for attempt in retrying:
            with attempt:
                result = await fn()
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise _unavailable(backend, exc.last_attempt.attempt_number + 1, cause) from cause
    return result


def _unavailable(backend: str, attempts: int, cause: BaseException | None) -> Unavailable:
    log.warning("%s storage unavailable: %r", backend, cause)
    # The driver's text can name hosts and ports: it goes to the log, not to clients.
    error = Unavailable(f"{backend} storage unavailable after {attempts} attempts", backend=backend)
    error.__cause__ = cause
    return error


# --- migrations ---------------------------------------------------------------------------

_SCHEMA_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)


def migration_scripts(dialect: Dialect) -> list[tuple[str, str]]:
    folder = resources.files("runtime.storage.sql").joinpath("migrations", dialect.name)
    scripts = [
        (entry.name.removesuffix(".sql"), entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    ]
    return sorted(scripts)


async def apply_migrations(conn: Conn, migrations: list[tuple[str, str]]) -> list[str]:
    """Apply the scripts not yet recorded, in name order; returns the names applied now."""
    if conn.dialect.migration_lock is not None:
        await conn.execute(conn.dialect.migration_lock)
    await conn.run_script(_SCHEMA_MIGRATIONS)
    done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
    applied = []
    for name, script in migrations:
        if name in done:
            continue
        await conn.run_script(script)
        await conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            name,
            await conn.now(),
        )
        applied.append(name)
    return applied


async def applied_migrations(conn: Conn) -> list[str]:
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    return [row["version"] for row in rows]


# --- scopes, the thread lock and the version ----------------------------------------------


def normalize_scopes(scopes: Collection[str]) -> tuple[str, ...]:
    # A bare string is a Collection[str] too; treating it as characters would be a silent leak.
    if isinstance(scopes, str):
        return (scopes,)
    return tuple(sorted(set(scopes)))


def placeholders(start: int, count: int) -> str:
    return ", ".join(f"${index}" for index in range(start, start + count))


def scope_clause(column: str, scopes: Collection[str], start: int) -> tuple[str, list[Any]]:
    """`column IN (...)` with parameters numbered from `start`; no scopes match nothing."""
    values = normalize_scopes(scopes)
    if not values:
        return "1 = 0", []
    return f"{column} IN ({placeholders(start, len(values))})", list(values)


def after_clause(args: list[Any], after: str | None, at: str, key: str) -> str:
    """` AND` the rows after the `keyset_cursor` `after` in (`at`, `key`) ascending order, its
    two parameters appended to `args`; "" without a cursor."""
    if after is None:
        return ""
    position = read_cursor(after)
    args += [position.at, position.key]
    n = len(args)
    return f" AND ({at} > ${n - 1} OR ({at} = ${n - 1} AND {key} > ${n}))"


async def thread_row(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str] | None = None,
    *,
    lock: bool = False,
) -> Row:
    """The thread row, optionally locked for the rest of the transaction; NotFound outside
    `scopes` exactly as for an unknown id."""
    sql = "SELECT * FROM threads WHERE id = $1"
    args: list[Any] = [thread_id]
    if scopes is not None:
        clause, values = scope_clause("scope", scopes, 2)
        sql += f" AND {clause}"
        args += values
    if lock:
        sql += conn.dialect.thread_lock
    row = await conn.fetchrow(sql, *args)
    if row is None:
        raise NotFound(f"thread {thread_id} not found")
    return row


# Ids and scopes that are safe inside a SQL string literal as they are.
LITERAL = re.compile(r"[A-Za-z0-9_:.\-]+")


@dataclass(frozen=True)
class ThreadLock:
    """The thread lock a write transaction starts with: the thread, and the scopes it must be
    in (None: any)."""

    thread_id: str
    scopes: tuple[str, ...] | None = None

    def sql(self, dialect: Dialect) -> str | None:
        """The lock alone, without parameters (to go with BEGIN in one round trip), or None
        where the dialect locks no row or a value would need escaping."""
        values = [self.thread_id, *(self.scopes or ())]
        if not dialect.thread_lock or not all(LITERAL.fullmatch(v) for v in values):
            return None
        sql = f"SELECT 1 FROM threads WHERE id = '{self.thread_id}'"
        if self.scopes is not None:
            scopes = ", ".join(f"'{scope}'" for scope in self.scopes)
            sql += f" AND scope IN ({scopes})" if scopes else " AND 1 = 0"
        return sql + dialect.thread_lock


def prelocked(conn: Conn, thread_id: str) -> bool:
    """Whether the transaction holds the thread's row lock from its first round trip (its row
    is then read by the next statement, which sees everything committed before the lock)."""
    return conn.locked == thread_id


async def lock_thread(conn: Conn, thread_id: str, scopes: Collection[str] | None = None) -> Row:
    """First statement of every write that touches a thread: it orders them per thread."""
    return await thread_row(conn, thread_id, scopes, lock=True)


async def bump(conn: Conn, thread_id: str) -> int:
    """+1 on the thread's version, at most once per transaction; returns the new version."""
    if thread_id in conn.bumped:
        return conn.bumped[thread_id]
    current = conn.versions.get(thread_id)
    if current is not None and conn.dialect.writing_ctes:
        # The version is known (read under the lock): the UPDATE needs no answer, so it is held
        # like any write nothing reads in between, and goes with COMMIT (`_PgConn.commit`).
        await conn.execute_later(
            "UPDATE threads SET version = version + 1, updated_at = $2 WHERE id = $1",
            thread_id,
            await conn.now(),
        )
        conn.bumped[thread_id] = current + 1
        return current + 1
    # Writes held by `execute_later` (the step's message, the run's row) go with it.
    rows = await conn.fetch_with_pending(
        "UPDATE threads SET version = version + 1, updated_at = $2 WHERE id = $1 RETURNING version",
        thread_id,
        await conn.now(),
    )
    version = rows[0]["version"] if rows else None
    if version is None:
        raise NotFound(f"thread {thread_id} not found")
    conn.bumped[thread_id] = int(version)
    return int(version)
