"""`PostgresStore`: the scale-out backend, an asyncpg pool shared by gateways and workers."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
import orjson

from runtime.storage.sql.core import Conn
from runtime.storage.sql.dialect import Dialect
from runtime.storage.sql.pg_pool import ConnectionPool
from runtime.storage.sql.rows import Row
from runtime.storage.sql.sql_store import SqlStore

# Arbitrary but fixed: every Threadline process serialises migrations on this advisory lock.
_MIGRATION_LOCK_KEY = 0x7468_726C_6D69
# The class key of the per-scope admission locks (an int4, like hashtext's result).
_SCOPE_LOCK_CLASS = 0x746C_7363

# A `$n` parameter of the shared SQL.
_PARAMETER = re.compile(r"\$(\d+)")


# The table a write changes (`INSERT INTO t`, `UPDATE t`, `DELETE FROM t`); None: unknown.
_WRITE = re.compile(r"\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)


# The statements are the shared SQL's, a few dozen: parsed once each, not per write.
@functools.lru_cache(maxsize=1024)
def _table(sql: str) -> str | None:
    match = _WRITE.match(sql)
    return match.group(1).lower() if match else None


@functools.lru_cache(maxsize=1024)
def _renumber(sql: str, offset: int) -> str:
    return _PARAMETER.sub(lambda match: f"${int(match.group(1)) + offset}", sql)


@functools.lru_cache(maxsize=1024)
def _pieces(sql: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`sql` split at its `$n` parameters: the text around them and each one's index (0-based),
    so that writing values in takes one join."""
    parts = _PARAMETER.split(sql)
    return tuple(parts[0::2]), tuple(int(n) - 1 for n in parts[1::2])


def _held_statement(held: list[tuple[str, tuple[Any, ...]]]) -> tuple[str, list[Any]]:
    """Writes held in order as one statement: each but the last a data-modifying WITH clause
    (all run to completion; no two change one table: `_PgConn.execute_later`), parameters
    renumbered in turn."""
    clauses: list[str] = []
    values: list[Any] = []
    for index, (sql, args) in enumerate(held):
        renumbered = _renumber(sql, len(values))
        values += args
        if index == len(held) - 1:
            prefix = f"WITH {', '.join(clauses)} " if clauses else ""
            return prefix + renumbered, values
        clauses.append(f"held_{index} AS ({renumbered})")
    raise ValueError("nothing held")


def _literal(value: Any) -> str | None:
    """`value` as an SQL literal of unknown type, which the server types from where it stands,
    as it types a parameter; None for a value this does not write (the caller then sends it
    as a parameter). Strings need standard_conforming_strings (a quote is the only character
    to escape) and hold no NUL (no Postgres text can)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    if isinstance(value, int):
        return f"'{int(value)}'"
    if isinstance(value, float):
        return f"'{float(value)!r}'"  # the shortest text that reads back as the same double
    if isinstance(value, str) and "\x00" not in value:
        return "'" + str.replace(value, "'", "''") + "'"
    return None


def _literal_statement(held: list[tuple[str, tuple[Any, ...]]], standard: bool) -> str | None:
    """`_held_statement` with its parameters written as literals (for the simple protocol, which
    takes none), or None when one of them has no literal."""
    if not standard:
        return None
    statement, values = _held_statement(held)
    literals = [_literal(value) for value in values]
    if any(literal is None for literal in literals):
        return None
    texts, indexes = _pieces(statement)
    written = [texts[0]]
    for index, text in zip(indexes, texts[1:], strict=True):
        written += (str(literals[index]), text)
    return "".join(written)


_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # class 08: connection exceptions
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    # The server ended an idle session (pg_terminate_backend, idle_session_timeout, failover)
    # and the client saw its FATAL message before the closed socket: the next statement finds
    # the protocol still consuming that error. The pool drops the connection (`pg_pool`).
    asyncpg.exceptions.InternalClientError,
    ConnectionError,
    OSError,
)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, _TRANSIENT):
        return True
    # A connection dropped mid-transaction makes asyncpg's ROLLBACK raise InterfaceError ("the
    # underlying connection is closed") while handling the real, transient cause: retry that.
    if isinstance(exc, asyncpg.InterfaceError) and exc.__context__ is not None:
        return isinstance(exc.__context__, _TRANSIENT)
    return False


def _contains(metadata: Mapping[str, str], start: int) -> tuple[str, list[Any]]:
    """JSON containment, in the form the `threads_metadata` GIN index (migration 0013)
    answers: the expression must be exactly the indexed one."""
    if not metadata:
        return "1 = 1", []
    return f"(metadata::jsonb) @> ${start}::jsonb", [orjson.dumps(dict(metadata)).decode()]


POSTGRES = Dialect(
    name="postgres",
    now_sql="extract(epoch from clock_timestamp())::double precision",
    # READ COMMITTED writes see everything committed before this lock was granted.
    thread_lock=" FOR UPDATE",
    is_transient=_is_transient,
    migration_lock=f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})",
    # Two-key form: the first key keeps these locks apart from the migration lock; a hash
    # collision between scopes only makes them wait for each other.
    scope_lock=f"SELECT pg_advisory_xact_lock({_SCOPE_LOCK_CLASS}, hashtext($1))",
    writing_ctes=True,
    composite_rows=True,
    run_lease_function="threadline_acquire_run_lease",
    metadata_match=_contains,
    start_run_function="threadline_start_run",
)


class _PgConn(Conn):
    """`begin`: a BEGIN not sent yet. It goes with the transaction's first statement: in the
    same round trip when that statement is `first_statement`'s, else just before it. (BEGIN
    alone takes no snapshot and no lock: sending it later changes nothing but round trips.)"""

    def __init__(self, connection: asyncpg.Connection, begin: str | None = None) -> None:
        super().__init__(POSTGRES)
        self._connection = connection
        self._begin = begin
        # Writes held by `execute_later`, in order: sent before the next statement, or inside
        # `fetch_with_pending`'s as data-modifying WITH clauses.
        self._pending: list[tuple[str, tuple[Any, ...]]] = []
        # What a unique violation of these constraints raises instead (`defer_unique`).
        self.unique_errors: dict[str, Exception] = {}

    @property
    def begun(self) -> bool:
        return self._begin is None

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    async def _ensure_begun(self) -> None:
        if self._begin is not None:
            begin, self._begin = self._begin, None
            await self._connection.execute(begin)

    async def flush(self) -> None:
        """Send the held writes, in order, in one statement (before any other statement)."""
        await self._ensure_begun()
        if not self._pending:
            return
        statement, values = _held_statement(self._pending)
        self._pending.clear()
        await self._connection.execute(statement, *values)

    async def commit(self) -> None:
        """End a write transaction: the held writes and COMMIT in one round trip (the simple
        protocol, their parameters written as literals: `_literal`), or, where a value has no
        literal here, the held writes then COMMIT."""
        if self._pending:
            script = _literal_statement(self._pending, self._standard_strings())
            if script is not None:
                begin, self._begin = self._begin, None
                self._pending.clear()
                await self._connection.execute(
                    f"{begin}; {script}; COMMIT;" if begin else f"{script}; COMMIT;"
                )
                return
            await self.flush()
        if self.begun:
            await self._connection.execute("COMMIT;")

    def _standard_strings(self) -> bool:
        settings = self._connection.get_settings()
        return getattr(settings, "standard_conforming_strings", None) == "on"

    async def execute(self, sql: str, *args: Any) -> None:
        await self.flush()
        await self._connection.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        await self.flush()
        return [dict(record) for record in await self._connection.fetch(sql, *args)]

    async def run_script(self, script: str) -> None:
        await self.flush()
        # Without arguments asyncpg uses the simple protocol, which accepts many statements.
        await self._connection.execute(script)

    async def execute_later(self, sql: str, *args: Any) -> None:
        # One statement must not change a row twice (Postgres would keep one of the changes):
        # a write to a table a held write changes sends what is held first; a write whose
        # table is not plain to see is not held.
        table = _table(sql)
        if table is None:
            await self.execute(sql, *args)
            return
        if table in self._pending_tables():
            await self.flush()
        self._pending.append((sql, args))

    def _pending_tables(self) -> set[str | None]:
        return {_table(held) for held, _ in self._pending}

    async def fetch_with_pending(self, sql: str, *args: Any) -> list[Row]:
        table = _table(sql)
        if not self._pending or table is None or table in self._pending_tables():
            return await self.fetch(sql, *args)
        await self._ensure_begun()
        statement, values = self._carrying(sql, args)
        return [dict(record) for record in await self._connection.fetch(statement, *values)]

    def defer_unique(self, constraint: str, error: Exception) -> bool:
        self.unique_errors[constraint] = error
        return True

    def raise_deferred(self, exc: BaseException) -> None:
        """Raise what `defer_unique` registered for the constraint `exc` violated, if any."""
        if isinstance(exc, asyncpg.UniqueViolationError):
            error = self.unique_errors.get(getattr(exc, "constraint_name", None) or "")
            if error is not None:
                raise error from None

    async def lock(self, sql: str, *args: Any) -> None:
        if not self._pending:
            await self.execute(sql, *args)
            return
        await self._ensure_begun()
        statement, values = self._carrying(sql, args)
        await self._connection.execute(statement, *values)

    def _carrying(self, sql: str, args: tuple[Any, ...]) -> tuple[str, list[Any]]:
        """`sql` with the held writes in one statement: each a data-modifying WITH clause (all
        run to completion; none reads what another writes, nor does `sql`), its parameters
        renumbered after `sql`'s. They are no longer held."""
        clauses, values = [], list(args)
        for index, (held, held_args) in enumerate(self._pending):
            renumbered = _renumber(held, len(values))
            clauses.append(f"held_{index} AS ({renumbered})")
            values += held_args
        self._pending.clear()
        return f"WITH {', '.join(clauses)} {sql}", values

    async def first_statement(self, sql: str) -> str | None:
        if self._begin is None or self._pending:
            return None
        begin, self._begin = self._begin, None
        # The simple protocol: BEGIN and the statement in one round trip; the explicit BEGIN
        # keeps the transaction open after it. The status is the last statement's.
        return str(await self._connection.execute(f"{begin}; {sql}"))


class _Connection(asyncpg.Connection):  # type: ignore[misc]
    """A pooled connection (`ConnectionPool`). The store keeps no session state on it (no
    LISTEN, no session settings, no session advisory locks: the migration lock is
    transaction-scoped), so nothing is reset between transactions; a connection returned
    inside a transaction is closed instead."""

    def get_reset_query(self) -> str:
        return ""


class PostgresPool:
    """Writes run READ COMMITTED (the dialect's `FOR UPDATE` on the thread row orders them);
    reads (snapshots) run in one REPEATABLE READ read-only transaction."""

    def __init__(self, dsn: str, min_size: int, max_size: int, close_timeout: float) -> None:
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.close_timeout = close_timeout
        self._pool: ConnectionPool | None = None

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        if self._pool is None:
            pool = ConnectionPool(
                self.dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                connection_class=_Connection,
            )
            await pool.open()
            self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close(self.close_timeout)

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[Conn]:
        pool = self._pool
        if pool is None:
            raise RuntimeError("PostgresStore is not open")
        async with pool.connection() as connection:
            if not write:
                transaction = connection.transaction(isolation="repeatable_read", readonly=True)
                async with transaction:
                    yield _PgConn(connection)
                return
            # A write's BEGIN goes with its first statement (`_PgConn`): the key claim
            # (`keys_tx.claim`) in the same round trip. COMMIT or ROLLBACK as asyncpg's
            # `Transaction` would (a failing ROLLBACK raises, chained to the cause).
            conn = _PgConn(connection, "BEGIN ISOLATION LEVEL READ COMMITTED")
            try:
                yield conn
                # COMMIT, with the writes still held (`_PgConn.commit`).
                await conn.commit()
            except BaseException as exc:
                if conn.begun:
                    # Also after a failed COMMIT (then there is no transaction left to end,
                    # which the server only warns about).
                    await connection.execute("ROLLBACK;")
                conn.raise_deferred(exc)
                raise

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Conn]:
        pool = self._pool
        if pool is None:
            raise RuntimeError("PostgresStore is not open")
        async with pool.connection() as connection:
            conn = _PgConn(connection)
            try:
                yield conn
                await conn.flush()
            except asyncpg.UniqueViolationError as exc:
                conn.raise_deferred(exc)
                raise

    def autocommit(self) -> AbstractAsyncContextManager[Conn]:
        # One statement outside BEGIN … COMMIT commits on its own: one round trip, not three.
        return self.statements()


class PostgresStore(SqlStore):
    """`SqlStore` over the Postgres dialect and an asyncpg pool on `dsn`."""

    def __init__(
        self, dsn: str, *, min_size: int = 1, max_size: int = 10, close_timeout: float = 10.0
    ) -> None:
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.close_timeout = close_timeout
        super().__init__(POSTGRES, PostgresPool(dsn, min_size, max_size, close_timeout))


__all__ = ["POSTGRES", "PostgresPool", "PostgresStore"]
