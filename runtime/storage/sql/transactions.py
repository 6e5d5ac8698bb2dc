"""`SqlTransactions`: the one path every `SqlStore` method runs through (retries, keyed writes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from realtime.bus_support import AsyncResource
from runtime.errors import InvariantViolation
from runtime.storage.sql import keys_tx
from runtime.storage.sql.core import Conn, Pool, ThreadLock, retry_call
from runtime.storage.sql.dialect import Dialect
from runtime.storage.sql.rows import new_id

T = TypeVar("T")


class SqlTransactions(AsyncResource):
    """How every `SqlStore` method runs: one transaction function through `_run`, retried as a
    whole on transient errors, writes keyed so a retry never repeats one (or, where COMMIT's
    outcome is always known, told by their `Conn`; one idempotent statement:
    `_write_statement`; a read of self-consistent statements: `_read_statements`)."""

    # Long enough to ride out a Postgres restart or failover (seconds), short enough that a
    # request still gets its 503 in bounded time: backoff 20 ms doubling to 2 s, plus jitter,
    # for at most 20 s after the first attempt (docs/operations.md, "Postgres is down").
    # Retrying that long is safe because writes are keyed (`_run`): a retry never repeats one.
    retry_attempts: int = 40
    retry_initial_wait: float = 0.02
    retry_max_wait: float = 2.0
    retry_budget: float = 20.0

    def __init__(self, dialect: Dialect, pool: Pool) -> None:
        self.dialect = dialect
        self.pool = pool
        self._writes = 0

    @property
    def backend(self) -> str:
        return self.dialect.name

    def _transaction(self, *, write: bool) -> AbstractAsyncContextManager[Conn]:
        return self.pool.transaction(write=write)

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await retry_call(
            fn,
            backend=self.backend,
            is_transient=self.dialect.is_transient,
            attempts=self.retry_attempts,
            initial_wait=self.retry_initial_wait,
            max_wait=self.retry_max_wait,
            budget=self.retry_budget,
        )

    async def _run(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        write: bool,
        key: str | None = None,
        lock: ThreadLock | None = None,
    ) -> T:
        """Run `fn` in one transaction, retried as a whole on transient errors (a retry re-reads
        everything it decides on).

        A write is *keyed*: a connection that drops during COMMIT leaves the outcome unknown,
        and re-running `fn` would then repeat a write that went through (a second assistant
        message, a second queued input, a resume's winner told it lost to itself). So every
        write first claims an idempotency key inside its own transaction (`keys_tx.claim`);
        a retry that finds its key claimed knows the earlier attempt committed and returns
        that attempt's result, without running `fn` again. The key is one per call (`key`
        names it for the log and the table; a random suffix keeps it unique per call).
        `lock`: the thread lock `fn` starts with, taken with the claim where that saves a round
        trip (`keys_tx.claim`).

        Where the backend always knows whether COMMIT went through
        (`Dialect.commit_outcome_known`, SQLite), the write is not keyed: a retry after an
        attempt that committed returns what that attempt computed, without running `fn`."""
        if not write:
            return await self._retry(lambda: self._attempt(fn, write=False))
        # What the attempt that got as far as COMMIT computed: the answer if COMMIT went through.
        done: list[tuple[T, list[Callable[[], None]]]] = []
        guarded = (
            _unkeyed(fn, done)
            if self.dialect.commit_outcome_known
            else _keyed(fn, done, new_id("tx") if key is None else f"{key}:{new_id('tx')}", lock)
        )
        self._writes += 1
        if self._writes % keys_tx.PRUNE_EVERY == 0:
            # Also where no key is claimed: keys written before (by a process that did) age out.
            await self._retry(lambda: self._attempt(keys_tx.prune, write=True))
        return await self._retry(lambda: self._attempt(guarded, write=True, done=done))

    async def _attempt(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        write: bool,
        done: list[tuple[T, list[Callable[[], None]]]] | None = None,
    ) -> T:
        async with self._transaction(write=write) as conn:
            result = await fn(conn)
        # After a replayed commit, the telemetry of the attempt that wrote is what is emitted.
        callbacks = done[0][1] if done else conn.after_commit
        for callback in callbacks:
            callback()
        return result

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=False)

    async def _read_statements(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """A read whose every statement is consistent on its own: outside a transaction."""

        async def attempt() -> T:
            async with self.pool.statements() as conn:
                return await fn(conn)

        return await self._retry(attempt)

    async def _write(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=True)

    async def _write_statement(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """A write of one statement that is atomic and idempotent by itself (running it again
        after an unknown outcome changes nothing): no idempotency key, and on Postgres no
        BEGIN and COMMIT either (`Pool.autocommit`)."""

        async def attempt() -> T:
            async with self.pool.autocommit() as conn:
                result = await fn(conn)
            for callback in conn.after_commit:
                callback()
            return result

        return await self._retry(attempt)


def _keyed(
    fn: Callable[[Conn], Awaitable[T]],
    done: list[tuple[T, list[Callable[[], None]]]],
    key: str,
    lock: ThreadLock | None,
) -> Callable[[Conn], Awaitable[T]]:
    """`fn` after claiming `key`: an attempt that finds it claimed returns what the attempt
    that committed computed (`done`), without running `fn` again."""

    async def keyed(conn: Conn) -> T:
        if not await keys_tx.claim(conn, key, lock):
            if not done:
                raise InvariantViolation(f"transaction {key} committed without a result")
            return done[0][0]
        result = await fn(conn)
        done[:] = [(result, conn.after_commit)]
        return result

    return keyed


def _unkeyed(
    fn: Callable[[Conn], Awaitable[T]], done: list[tuple[T, list[Callable[[], None]]]]
) -> Callable[[Conn], Awaitable[T]]:
    """`fn` where the pool marks a committed `Conn`: an attempt after one that committed
    returns what that one computed (`done`), without running `fn` again."""
    ran: list[Conn] = []

    async def unkeyed(conn: Conn) -> T:
        if ran and ran[0].committed:
            return done[0][0]  # an earlier attempt committed: nothing is redone
        result = await fn(conn)
        done[:] = [(result, conn.after_commit)]
        ran[:] = [conn]
        return result

    return unkeyed
