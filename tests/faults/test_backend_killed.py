"""The server ends the store's sessions while they are idle (pg_terminate_backend, as an
operator, `idle_session_timeout` or a failover does): the next reads and writes go through on
fresh connections, each write committed once."""

from __future__ import annotations

import asyncpg
import pytest

from runtime.storage import PostgresStore
from tests.services import require_postgres

pytestmark = pytest.mark.postgres


async def kill_sessions(database: str) -> int:
    """Terminate every session on `database` (this test's own); how many there were."""
    admin = await asyncpg.connect(require_postgres())
    try:
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                database.rsplit("/", 1)[1],
            )
        )
    finally:
        await admin.close()


async def test_reads_and_writes_go_through_after_the_server_ends_idle_sessions(
    database: str,
) -> None:
    async with PostgresStore(database, min_size=2, max_size=4) as store:
        thread = await store.create_thread("s", title="before")
        for attempt in range(3):
            assert await kill_sessions(database) >= 1
            assert (await store.get_thread(thread.id, ["s"])).title == "before"
            assert await kill_sessions(database) >= 1
            admission = await store.submit_input(
                thread.id, ["s"], text=f"after kill {attempt}", submitted_by="t"
            )
            assert admission.version > 0
        # Each write committed exactly once: the first started a run, the others queued.
        messages = await store.list_messages(thread.id)
        texts = [getattr(part, "text", None) for m in messages for part in m.parts]
        texts += [item.text for item in await store.list_queue(thread.id)]
        assert sorted(t for t in texts if t) == [f"after kill {n}" for n in range(3)], texts
