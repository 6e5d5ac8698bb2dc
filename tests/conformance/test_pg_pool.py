"""`ConnectionPool` (the Postgres store's connections) against a real Postgres: bounded, fair,
cancellation-safe, and a connection in an unknown state is never lent again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from runtime.storage.sql.pg_pool import ConnectionPool
from tests.services import require_postgres

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    pool = ConnectionPool(require_postgres(), min_size=1, max_size=2)
    await pool.open()
    yield pool
    await pool.close(5.0)


async def backend_pid(connection: asyncpg.Connection) -> int:
    return int(await connection.fetchval("SELECT pg_backend_pid()"))


async def test_never_more_than_max_size_connections_and_every_caller_served(
    pool: ConnectionPool,
) -> None:
    holding, most, served = 0, 0, 0

    async def use() -> None:
        nonlocal holding, most, served
        async with pool.connection() as connection:
            holding += 1
            most = max(most, holding)
            await connection.fetchval("SELECT pg_sleep(0.01)")
            holding -= 1
            served += 1

    await asyncio.gather(*(use() for _ in range(12)))
    assert (most, served, pool.size) == (2, 12, 2)
    assert pool.idle == 2


async def test_a_returned_connection_is_lent_again(pool: ConnectionPool) -> None:
    async with pool.connection() as first:
        pid = await backend_pid(first)
    async with pool.connection() as again:
        assert await backend_pid(again) == pid


async def test_a_waiter_cancelled_loses_no_connection(pool: ConnectionPool) -> None:
    held = [await pool.acquire(), await pool.acquire()]
    waiting = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for connection in held:
        pool.release(connection)
    async with asyncio.timeout(2):
        a, b = await pool.acquire(), await pool.acquire()
    assert pool.size == 2
    pool.release(a)
    pool.release(b)


async def test_a_connection_handed_to_a_cancelled_waiter_goes_to_the_next(
    pool: ConnectionPool,
) -> None:
    held = [await pool.acquire(), await pool.acquire()]
    first = asyncio.create_task(pool.acquire())
    second = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    pool.release(held[0])  # handed to `first`, which is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(2):
        got = await second
    assert got is held[0]
    pool.release(got)
    pool.release(held[1])
    assert (pool.size, pool.idle) == (2, 2)


async def test_a_broken_connection_is_dropped_and_replaced(pool: ConnectionPool) -> None:
    async with pool.connection() as doomed:
        pid = await backend_pid(doomed)
    admin = await asyncpg.connect(require_postgres())
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    # The idle connection may not have noticed yet: the statement fails, and the connection
    # is not lent again.
    for _ in range(2):
        try:
            async with pool.connection() as connection:
                assert await backend_pid(connection) != pid
                break
        except (
            asyncpg.PostgresConnectionError,
            asyncpg.exceptions.OperatorInterventionError,
            asyncpg.exceptions.InternalClientError,
            asyncpg.InterfaceError,
            OSError,
        ):
            continue
    async with pool.connection() as connection:
        assert await backend_pid(connection) != pid
    assert pool.size <= 2


async def test_a_connection_left_by_a_cancelled_statement_is_not_lent_again(
    pool: ConnectionPool,
) -> None:
    started = asyncio.Event()
    pids: list[int] = []

    async def slow() -> None:
        async with pool.connection() as connection:
            pids.append(await backend_pid(connection))
            started.set()
            await connection.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(slow())
    await started.wait()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5), pool.connection() as connection:
        assert await backend_pid(connection) != pids[0]
        assert await connection.fetchval("SELECT 1") == 1


async def test_a_connection_returned_inside_a_transaction_is_dropped(
    pool: ConnectionPool,
) -> None:
    connection = await pool.acquire()
    pid = await backend_pid(connection)
    await connection.execute("BEGIN")
    pool.release(connection)
    assert connection.is_closed()
    async with pool.connection() as fresh:
        assert await backend_pid(fresh) != pid
        assert not fresh.is_in_transaction()


async def test_an_error_between_statements_keeps_the_connection(pool: ConnectionPool) -> None:
    with pytest.raises(ValueError):
        async with pool.connection() as connection:
            pid = await backend_pid(connection)
            raise ValueError("the caller's own error")
    with pytest.raises(asyncpg.UndefinedTableError):
        async with pool.connection() as connection:
            assert await backend_pid(connection) == pid
            await connection.execute("SELECT * FROM no_such_table_here")
    async with pool.connection() as connection:
        assert await backend_pid(connection) == pid


async def test_close_waits_for_lent_connections_then_refuses() -> None:
    pool = ConnectionPool(require_postgres(), min_size=1, max_size=1)
    await pool.open()
    connection = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(pool.close(5.0))
    await asyncio.sleep(0.01)
    with pytest.raises(asyncpg.InterfaceError):
        await waiter
    assert not closing.done()  # the lent connection is still out
    pool.release(connection)
    await asyncio.wait_for(closing, 2)
    assert connection.is_closed() and pool.size == 0
    with pytest.raises(asyncpg.InterfaceError):
        await pool.acquire()


async def test_close_terminates_what_is_not_returned_in_time() -> None:
    pool = ConnectionPool(require_postgres(), min_size=0, max_size=1)
    connection = await pool.acquire()
    await pool.close(0.05)
    assert connection.is_closed()


async def test_open_fails_cleanly_on_an_unreachable_server() -> None:
    pool = ConnectionPool("postgresql://postgres@127.0.0.1:1/postgres", min_size=1, max_size=2)
    with pytest.raises(OSError):
        await pool.open()
    assert pool.size == 0
