"""`ConnectionPool`: the Postgres store's asyncpg connections, lent one caller at a time.

asyncpg's own pool runs every release in a task of its own (`asyncio.shield`) and re-arms an
idle timer each time: about 20 µs of CPU and an extra event-loop turn per transaction, several
per run. The store needs less: its connections hold no session state (no LISTEN, no session
settings or advisory locks, nothing to reset), each transaction is ended by the store before
the connection goes back (`PostgresPool.transaction`), and a connection that broke is simply
dropped. So lending is a list pop and returning a list push, with no await in between: a
caller cancelled anywhere cannot leave a connection half returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

import asyncpg

# Errors after which the client may be out of step with its server (a statement still in
# flight, a transaction state or a FATAL message not seen yet): client-side protocol and state
# errors, timeouts, socket errors, and the server's own errors that end the session (class 08
# connection exceptions, class 57 operator intervention such as pg_terminate_backend, FATAL).
_OUT_OF_STEP: tuple[type[BaseException], ...] = (
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.FatalPostgresError,
    TimeoutError,
    OSError,
)


def reusable_after(exc: BaseException) -> bool:
    """Whether a connection is still in step with its server after the block using it raised
    `exc`: yes after an error the server reported for a statement, or one raised between
    statements; no after a cancellation or an error of `_OUT_OF_STEP`."""
    return isinstance(exc, Exception) and not isinstance(exc, _OUT_OF_STEP)


class ConnectionPool:
    """At most `max_size` connections to `dsn`, `min_size` of them opened up front; the most
    recently returned is lent first (its buffers are warm). A caller finding none idle and the
    pool full waits, first come first served."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int,
        max_size: int,
        connection_class: type[asyncpg.Connection] = asyncpg.Connection,
    ) -> None:
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ValueError(f"pool sizes min {min_size}, max {max_size}")
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.connection_class = connection_class
        self._idle: list[asyncpg.Connection] = []
        # Connections open or being opened, lent or idle.
        self._size = 0
        # Callers waiting for a connection: each future gets one, or None for "a place is free,
        # open one yourself".
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        self._lent: set[asyncpg.Connection] = set()
        self._closing = False
        self._returned = asyncio.Event()

    @property
    def size(self) -> int:
        return self._size

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def open(self) -> None:
        """Open `min_size` connections (the first failure raises, nothing is left open)."""
        opened: list[asyncpg.Connection] = []
        try:
            for _ in range(self.min_size - self._size):
                opened.append(await self._connect())
        except BaseException:
            for connection in opened:
                connection.terminate()
            raise
        self._size += len(opened)
        self._idle.extend(opened)

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn, connection_class=self.connection_class)

    async def acquire(self) -> asyncpg.Connection:
        if self._closing:
            raise asyncpg.InterfaceError("the connection pool is closing")
        while self._idle:
            connection = self._idle.pop()
            if not connection.is_closed():
                self._lent.add(connection)
                return connection
            self._size -= 1  # broke while idle (the server went away): dropped
        if self._size >= self.max_size:
            waiter: asyncio.Future[asyncpg.Connection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiters.append(waiter)
            try:
                connection = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    # Handed one just as the caller was cancelled: it goes to the next.
                    self._pass_on(waiter.result())
                else:
                    self._waiters.remove(waiter)
                raise
            if connection is not None:
                self._lent.add(connection)
                return connection
            # A place was freed (a broken connection dropped): this caller opens the new one.
        self._size += 1
        try:
            connection = await self._connect()
        except BaseException:
            self._size -= 1
            self._pass_on(None)
            raise
        self._lent.add(connection)
        return connection

    def release(self, connection: asyncpg.Connection, *, reusable: bool = True) -> None:
        """Take `connection` back: to the first waiter, else idle. One that broke, that is
        still inside a transaction (which the store never leaves open) or that is not
        `reusable` is closed and dropped, and its place offered to a waiter."""
        if connection not in self._lent:
            return  # not lent by this pool, or returned already
        self._lent.remove(connection)
        self._returned.set()
        if (
            not reusable
            or self._closing
            or connection.is_closed()
            or connection.is_in_transaction()
        ):
            connection.terminate()
            self._size -= 1
            self._pass_on(None)
            return
        self._pass_on(connection)

    def _pass_on(self, connection: asyncpg.Connection | None) -> None:
        """`connection` (None: a free place) to the first caller still waiting, else idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        if connection is None:
            return
        if self._closing:
            connection.terminate()
            self._size -= 1
        else:
            self._idle.append(connection)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for the block; returned after it (dropped when the block left it in a
        state not known to be clean: `reusable_after`)."""
        connection = await self.acquire()
        try:
            yield connection
        except BaseException as exc:
            self.release(connection, reusable=reusable_after(exc))
            raise
        self.release(connection)

    async def close(self, timeout: float) -> None:
        """Close idle connections gracefully, wait up to `timeout` seconds for lent ones to come
        back (each is closed as it does), then terminate what is still out."""
        self._closing = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(asyncpg.InterfaceError("the connection pool is closing"))
        self._waiters.clear()
        idle, self._idle = self._idle, []
        self._size -= len(idle)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(c.close() for c in idle), return_exceptions=True)
                while self._lent:
                    self._returned.clear()
                    await self._returned.wait()
        for connection in [*idle, *self._lent]:
            connection.terminate()
        self._lent.clear()
