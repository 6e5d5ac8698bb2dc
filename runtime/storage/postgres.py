"""`PostgresStore`: the scale-out backend, an asyncpg pool shared by gateways and workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from runtime.storage.sql import SqlStore
from runtime.storage.sql_core import Conn
from runtime.storage.sql_rows import Row

# Arbitrary but fixed: every Threadline process serialises migrations on this advisory lock.
_MIGRATION_LOCK_KEY = 0x7468_726C_6D69

_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # class 08: connection exceptions
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    ConnectionError,
    OSError,
)


class _PgConn(Conn):
    def __init__(self, connection: asyncpg.Connection, now_sql: str) -> None:
        super().__init__(now_sql)
        self._connection = connection

    async def execute(self, sql: str, *args: Any) -> None:
        await self._connection.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return [dict(record) for record in await self._connection.fetch(sql, *args)]

    async def run_script(self, script: str) -> None:
        # Without arguments asyncpg uses the simple protocol, which accepts many statements.
        await self._connection.execute(script)


class PostgresStore(SqlStore):
    """Writes lock the thread row first (READ COMMITTED sees everything committed before the
    lock was granted); snapshots read in one REPEATABLE READ read-only transaction."""

    backend = "postgres"
    now_sql = "extract(epoch from clock_timestamp())::double precision"
    lock_suffix = " FOR UPDATE"

    def __init__(
        self, dsn: str, *, min_size: int = 1, max_size: int = 10, close_timeout: float = 10.0
    ) -> None:
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.close_timeout = close_timeout
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        if self._pool is not None:
            return

        async def connect() -> asyncpg.Pool:
            return await asyncpg.create_pool(
                self.dsn, min_size=self.min_size, max_size=self.max_size
            )

        self._pool = await self._retry_call(connect)
        try:
            await self.migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), self.close_timeout)
        except TimeoutError:
            pool.terminate()

    def _is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, _TRANSIENT)

    async def _migration_lock(self, conn: Conn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK_KEY)

    @asynccontextmanager
    async def _transaction(self, *, write: bool) -> AsyncIterator[Conn]:
        pool = self._pool
        if pool is None:
            raise RuntimeError("PostgresStore is not open")
        async with pool.acquire() as connection:
            transaction = connection.transaction(
                isolation="read_committed" if write else "repeatable_read", readonly=not write
            )
            async with transaction:
                yield _PgConn(connection, self.now_sql)


__all__ = ["PostgresStore"]
