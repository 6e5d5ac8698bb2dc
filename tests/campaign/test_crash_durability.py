"""The campaign's Postgres keeps what it acknowledged across the nemesis's crash restart
(issue 34: the "lost sends" were commits Postgres acknowledged under `synchronous_commit=off`
and then dropped in crash recovery; the server had kept its promise)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest

from tests.servers import PostgresServer

# Acknowledged commits in a burst, then the crash at once: with asynchronous commits the last
# ~200 ms of them (the WAL writer's delay) are still in shared memory when it comes.
COMMITS = 200


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.postgres
async def test_a_crash_restart_keeps_every_acknowledged_commit(postgres: PostgresServer) -> None:
    """Breaks with: `synchronous_commit` back to `off` in `PostgresServer._launch` (122 and
    149 of 200 kept in three tries)."""
    conn = await asyncpg.connect(postgres.address)
    try:
        await conn.execute("CREATE TABLE acked (n integer PRIMARY KEY)")
        for n in range(COMMITS):  # each statement its own transaction, acknowledged on return
            await conn.execute("INSERT INTO acked VALUES ($1)", n)
    finally:
        conn.terminate()
    await asyncio.to_thread(postgres.restart, True)  # SIGQUIT: crash recovery on start
    conn = await asyncpg.connect(postgres.address)
    try:
        kept = await conn.fetchval("SELECT count(*) FROM acked")
    finally:
        await conn.close()
    assert kept == COMMITS
