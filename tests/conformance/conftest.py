"""Store fixtures: each store suite runs on SQLite (a file), Postgres (a database of its own) and
a wrapper exposing only the `Store` interface (over SQLite); the SQL-only suites (`test_sql_*`)
take `sql_store`, on SQLite and Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from runtime.storage import PostgresStore, SqliteStore, SqlStore
from runtime.storage.store import Store
from tests.conformance.public_store import PublicStore
from tests.services import (
    create_postgres_database_sync,
    drop_postgres_database_sync,
    empty_postgres_database,
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
        return lambda: cast(Store, PublicStore(sqlite()))
    return await _sql_factory(request.param, request, tmp_path)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[Store]:
    async with make_store() as opened:
        yield opened


@pytest.fixture
async def sql_store(make_sql_store: SqlStoreFactory) -> AsyncIterator[SqlStore]:
    async with make_sql_store() as opened:
        yield opened
