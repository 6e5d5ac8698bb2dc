"""Postgres and Redis for tests: a database or key prefix of our own, cleaned up afterwards."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

PG_ADMIN_DSN = os.environ.get("THREADLINE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("THREADLINE_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a service is missing, except under CI=true, where that is a failure."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: services are required)")
    pytest.skip(message)


def require_postgres() -> None:
    require_service("PostgreSQL", "127.0.0.1", 5432)


def require_redis() -> None:
    require_service("Redis", "127.0.0.1", 6379)


async def _admin_execute(admin_dsn: str, sql: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


def _sibling_dsn(admin_dsn: str, name: str) -> str:
    return admin_dsn.rsplit("/", 1)[0] + "/" + name


async def create_database(admin_dsn: str, prefix: str) -> str:
    """Create a database named `prefix` + random hex through `admin_dsn`; returns its DSN."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    await _admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    return _sibling_dsn(admin_dsn, name)


async def drop_database(admin_dsn: str, dsn: str, prefix: str) -> None:
    """Drop the database of `dsn`, refusing any name not made by create_database(prefix)."""
    name = dsn.rsplit("/", 1)[1]
    assert name.startswith(prefix), "only drop what we created"
    await _admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def own_postgres_database(
    admin_dsn: str = PG_ADMIN_DSN, prefix: str = "threadline_test_"
) -> AsyncIterator[str]:
    """Create a database of our own, yield its DSN, drop it (and only it) afterwards."""
    dsn = await create_database(admin_dsn, prefix)
    try:
        yield dsn
    finally:
        await drop_database(admin_dsn, dsn, prefix)


@asynccontextmanager
async def temporary_postgres_database() -> AsyncIterator[str]:
    """A database of the test's own (Postgres is required under CI=true)."""
    require_postgres()
    async with own_postgres_database() as dsn:
        yield dsn


def unique_prefix() -> str:
    """A Redis key/channel prefix of our own, so parallel tests never see each other."""
    return f"threadline-test-{uuid.uuid4().hex[:10]}:"


def _run_in_own_loop(fn: Any) -> None:
    """Run a coroutine function to completion on a fresh loop in a helper thread: session
    fixtures may be first requested from inside a running test loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(fn())).result()


def create_postgres_database_sync() -> str:
    """Create a database of our own outside any running event loop (for session fixtures)."""
    require_postgres()
    created: list[str] = []

    async def create() -> None:
        created.append(await create_database(PG_ADMIN_DSN, "threadline_test_"))

    _run_in_own_loop(create)
    return created[0]


def drop_postgres_database_sync(dsn: str) -> None:
    _run_in_own_loop(lambda: drop_database(PG_ADMIN_DSN, dsn, "threadline_test_"))


async def empty_postgres_database(dsn: str) -> None:
    """Remove every row the previous test left; the schema, the migration records and the
    fencing counter (tokens only ever grow) stay."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        tables = [
            row["tablename"]
            for row in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename NOT IN ('schema_migrations', 'fencing_counter')"
            )
        ]
        if tables:
            await conn.execute(
                "TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"
            )
    finally:
        await conn.close()
