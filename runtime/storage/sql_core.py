"""Shared SQL plumbing: the connection adapter, retried transactions, migrations, thread locks."""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager
from importlib import resources
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from runtime import telemetry
from runtime.errors import NotFound, Unavailable
from runtime.storage.sql_rows import Row

T = TypeVar("T")

_SCHEMA_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)


log = logging.getLogger(__name__)

class Conn(abc.ABC):
    """One connection inside one transaction. SQL uses `$n` placeholders on every backend.

    Also carries per-transaction state: the database time (read once, after the thread lock,
    so every check in the transaction uses the same instant), the version bumps done (at most
    one per thread) and telemetry to emit only once the transaction committed.
    """

    def __init__(self, now_sql: str) -> None:
        self._now_sql = now_sql
        self._now: float | None = None
        self.bumped: dict[str, int] = {}
        self.after_commit: list[Callable[[], None]] = []

    @abc.abstractmethod
    async def execute(self, sql: str, *args: Any) -> None: ...

    @abc.abstractmethod
    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    @abc.abstractmethod
    async def run_script(self, script: str) -> None:
        """Run several `;`-separated statements (migrations) inside the current transaction."""

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return None if row is None else next(iter(row.values()))

    async def now(self) -> float:
        if self._now is None:
            self._now = float(await self.fetchval(f"SELECT {self._now_sql} AS now"))
        return self._now

    def on_commit(self, callback: Callable[[], None]) -> None:
        self.after_commit.append(callback)


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


class SqlCore(abc.ABC):
    """Transaction plumbing shared by every SQL backend; the backend supplies the connection."""

    backend: ClassVar[str] = "sql"
    # Database clock in epoch seconds; lease expiry never trusts the application's clock.
    now_sql: ClassVar[str] = ""
    # Row lock taken on the thread at the start of a write transaction (empty where the
    # whole database is locked by the transaction itself, as in SQLite).
    lock_suffix: ClassVar[str] = ""
    retry_attempts: int = 6
    retry_initial_wait: float = 0.02
    retry_max_wait: float = 1.0

    # --- backend hooks ------------------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def _transaction(self, *, write: bool) -> AbstractAsyncContextManager[Conn]: ...

    def _is_transient(self, exc: BaseException) -> bool:
        return False

    async def _migration_lock(self, conn: Conn) -> None:
        return None

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- retried transactions -----------------------------------------------------------

    def _count_retry(self, state: RetryCallState) -> None:
        telemetry.safe_add(telemetry.STORAGE_RETRIES, 1, {"backend": self.backend})

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.retry_attempts),
            # Exponential backoff plus jitter, so processes that collided do not collide again.
            wait=wait_exponential(multiplier=self.retry_initial_wait, max=self.retry_max_wait)
            + wait_random(0, self.retry_initial_wait),
            retry=retry_if_exception(self._is_transient),
            before_sleep=self._count_retry,
            reraise=False,
        )

    async def _retry_call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn` with backoff on transient errors; `Unavailable` once retries run out."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    result = await fn()
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            log.warning("%s storage unavailable: %r", self.backend, cause)
            # The driver's text can name hosts and ports: it goes to the log, not to clients.
            raise Unavailable(
                f"{self.backend} storage unavailable after {self.retry_attempts} attempts",
                backend=self.backend,
            ) from cause
        return result

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], *, write: bool) -> T:
        # The whole transaction function is retried: a retry re-reads everything it decides on.
        async def once() -> T:
            async with self._transaction(write=write) as conn:
                result = await fn(conn)
            for callback in conn.after_commit:
                callback()
            return result

        return await self._retry_call(once)

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=False)

    async def _write(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=True)

    # --- migrations ---------------------------------------------------------------------

    def _migrations(self) -> list[tuple[str, str]]:
        folder = resources.files("runtime.storage").joinpath("migrations", self.backend)
        scripts = [
            (entry.name.removesuffix(".sql"), entry.read_text(encoding="utf-8"))
            for entry in folder.iterdir()
            if entry.name.endswith(".sql")
        ]
        return sorted(scripts)

    async def migrate(self) -> list[str]:
        """Apply pending migrations in one transaction; returns the names applied now."""
        migrations = self._migrations()

        async def apply(conn: Conn) -> list[str]:
            await self._migration_lock(conn)
            await conn.run_script(_SCHEMA_MIGRATIONS)
            rows = await conn.fetch("SELECT version FROM schema_migrations")
            done = {row["version"] for row in rows}
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

        return await self._write(apply)

    async def applied_migrations(self) -> list[str]:
        async def tx(conn: Conn) -> list[str]:
            rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
            return [row["version"] for row in rows]

        return await self._read(tx)

    # --- helpers used inside transactions -----------------------------------------------

    async def _thread_row(
        self,
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
            sql += self.lock_suffix
        row = await conn.fetchrow(sql, *args)
        if row is None:
            raise NotFound(f"thread {thread_id} not found")
        return row

    async def _lock_thread(
        self, conn: Conn, thread_id: str, scopes: Collection[str] | None = None
    ) -> Row:
        return await self._thread_row(conn, thread_id, scopes, lock=True)

    async def _bump(self, conn: Conn, thread_id: str) -> int:
        """+1 on the thread's version, at most once per transaction; returns the new version."""
        if thread_id in conn.bumped:
            return conn.bumped[thread_id]
        version = await conn.fetchval(
            "UPDATE threads SET version = version + 1, updated_at = $2 WHERE id = $1 "
            "RETURNING version",
            thread_id,
            await conn.now(),
        )
        if version is None:
            raise NotFound(f"thread {thread_id} not found")
        conn.bumped[thread_id] = int(version)
        return int(version)
