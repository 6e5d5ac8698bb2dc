"""SQLite's write lock held by another process: a transaction waits for it without blocking the
event loop, up to the pool's busy timeout, then fails as transient (the store retries it)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from runtime.storage.sql.sqlite import SQLITE, SqlitePool


def holder(path: Path) -> sqlite3.Connection:
    """Another connection (as another process would be) holding the file's write lock."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


async def open_pool(path: Path, busy_timeout_ms: int) -> SqlitePool:
    pool = SqlitePool(str(path), busy_timeout_ms)
    await pool.open()
    async with pool.transaction(write=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
    return pool


async def test_a_write_waits_for_the_lock_and_the_loop_keeps_running(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    pool = await open_pool(path, busy_timeout_ms=5000)
    other = holder(path)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async def release() -> None:
        await asyncio.sleep(0.3)
        other.execute("COMMIT")

    ticker = asyncio.create_task(tick())
    releaser = asyncio.create_task(release())
    started = time.monotonic()
    try:
        async with pool.transaction(write=True) as conn:
            await conn.execute("INSERT INTO t (n) VALUES ($1)", 1)
    finally:
        ticker.cancel()
        await releaser
    assert time.monotonic() - started >= 0.25  # it waited for the other writer
    assert ticks >= 10  # and the loop ran meanwhile
    async with pool.transaction(write=False) as conn:
        assert await conn.fetch("SELECT n FROM t") == [{"n": 1}]
    other.close()
    await pool.close()


async def test_a_lock_held_past_the_busy_timeout_fails_as_transient(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    pool = await open_pool(path, busy_timeout_ms=200)
    other = holder(path)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError) as refused:
        async with pool.transaction(write=True) as conn:
            await conn.execute("INSERT INTO t (n) VALUES ($1)", 2)
    waited = time.monotonic() - started
    assert SQLITE.is_transient(refused.value)
    assert 0.1 <= waited < 2.0
    other.execute("ROLLBACK")
    async with pool.transaction(write=False) as conn:
        assert await conn.fetch("SELECT n FROM t") == []  # nothing was written
    other.close()
    await pool.close()
