"""Store fixtures: each store test runs on SQLite (a file) and Postgres (a database of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from runtime.storage import PostgresStore, SqliteStore, SqlStore
from tests.services import (
    create_postgres_database_sync,
    drop_postgres_database_sync,
    empty_postgres_database,
)

StoreFactory = Callable[[], SqlStore]


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """One database of the test session's own; each test starts from empty tables. Creating a
    database per test costs about a second each, most of the suite's Postgres time."""
    dsn = create_postgres_database_sync()
    try:
        yield dsn
    finally:
        drop_postgres_database_sync(dsn)


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory of unopened stores that all share one database (to test reopening, several
    processes, ...). Postgres uses the session's database, emptied before the test."""
    if request.param == "sqlite":
        path = tmp_path / "threadline.db"
        yield lambda: SqliteStore(path)
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        await empty_postgres_database(dsn)
        yield lambda: PostgresStore(dsn, max_size=20)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[SqlStore]:
    async with make_store() as opened:
        yield opened
