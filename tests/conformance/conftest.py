"""Store fixtures: each store test runs on SQLite (a file) and Postgres (a database of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from runtime.storage import PostgresStore, SqliteStore, SqlStore
from tests.services import temporary_postgres_database

StoreFactory = Callable[[], SqlStore]


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory of unopened stores that all share one database (to test reopening, several
    processes, ...). Postgres gets a database of its own, dropped afterwards."""
    if request.param == "sqlite":
        path = tmp_path / "threadline.db"
        yield lambda: SqliteStore(path)
    else:
        async with temporary_postgres_database() as dsn:
            yield lambda: PostgresStore(dsn, max_size=20)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[SqlStore]:
    async with make_store() as opened:
        yield opened
