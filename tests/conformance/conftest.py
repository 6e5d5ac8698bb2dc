"""Store fixtures: each store suite runs on SQLite (a file), Postgres (a database of its own) and
a wrapper exposing only the `Store` interface (over SQLite); the SQL-only suites (`test_sql_*`)
take `sql_store`, on SQLite and Postgres. Quota counter fixtures: `counters`, in-process and on
Redis and Redis Cluster."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from realtime.counters import Counters, MemoryCounters, RedisCounters
from runtime.storage import PostgresStore, SqliteStore, SqlStore
from runtime.storage.store import Store
from tests.conformance.public_store import PublicStore
from tests.services import (
    create_postgres_database_sync,
    drop_postgres_database_sync,
    empty_postgres_database,
    require_redis,
    require_redis_cluster,
)

StoreFactory = Callable[[], Store]
SqlStoreFactory = Callable[[], SqlStore]
SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """One database of the test session's own; each test starts from empty tables. Creating a
    database per test costs about a second each, most of the suite's Postgres time."""
    dsn = create_postgres_database_sync()
    try:
        yield dsn
    finally:
        drop_postgres_database_sync(dsn)


async def _sql_factory(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> SqlStoreFactory:
    if backend == "sqlite":
        path = tmp_path / "threadline.db"
        return lambda: SqliteStore(path)
    dsn = request.getfixturevalue("postgres_dsn")
    await empty_postgres_database(dsn)
    return lambda: PostgresStore(dsn, max_size=20)


@pytest.fixture(params=SQL_BACKENDS)
async def make_sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> SqlStoreFactory:
    """A factory of unopened SQL stores that all share one database (to test reopening,
    several processes, ...). Postgres uses the session's database, emptied before the test."""
    return await _sql_factory(request.param, request, tmp_path)


@pytest.fixture(params=[*SQL_BACKENDS, "public"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """`make_sql_store`'s factories, and `public`: SQLite behind `PublicStore`, which exposes
    the `Store` interface and nothing else."""
    if request.param == "public":
        sqlite = await _sql_factory("sqlite", request, tmp_path)
        return lambda: PublicStore(sqlite())
    return await _sql_factory(request.param, request, tmp_path)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[Store]:
    async with make_store() as opened:
        yield opened


@pytest.fixture
async def sql_store(make_sql_store: SqlStoreFactory) -> AsyncIterator[SqlStore]:
    async with make_sql_store() as opened:
        yield opened


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
async def counters(request: pytest.FixtureRequest) -> AsyncIterator[Counters]:
    """Quota counters (the counter and connection-slot suites): in-process, Redis, Cluster."""
    if request.param == "memory":
        yield MemoryCounters()
        return
    url = require_redis() if request.param == "redis" else require_redis_cluster()
    opened = RedisCounters(url, f"test-limits-{uuid.uuid4().hex[:8]}:")
    try:
        yield opened
    finally:
        await opened.close()
