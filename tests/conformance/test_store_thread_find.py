"""Store conformance: thread metadata patches, and the thread list's filters and cursor."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.domain import MAX_METADATA_BYTES
from runtime.errors import InvalidInput, NotFound, TooLarge
from runtime.storage import SqlStore
from runtime.storage.sql import threads_tx
from runtime.storage.store import Store
from runtime.storage.thread_query import ThreadQuery, ThreadStatus, page_cursor
from tests.conformance.store_helpers import (
    FOREIGN,
    SCOPE,
    SCOPES,
    finish,
    new_thread,
    start_run,
    suspend,
)


async def test_a_metadata_patch_merges_removes_and_is_one_version(store: Store) -> None:
    thread = await store.create_thread(SCOPE, "t", {"owner": "alice", "tags": {"a": 1, "b": 2}})
    patched = await store.update_metadata(
        thread.id, SCOPES, {"owner": None, "team": "red", "tags": {"b": None, "c": [3]}}
    )
    assert patched.metadata == {"team": "red", "tags": {"a": 1, "c": [3]}}
    assert patched.version == thread.version + 1
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.thread.metadata == patched.metadata
    assert snapshot.thread.version == patched.version


async def test_a_metadata_patch_is_refused_whole(store: Store) -> None:
    thread = await store.create_thread(SCOPE, "t", {"big": "x" * (MAX_METADATA_BYTES - 100)})
    with pytest.raises(TooLarge):  # the merged object over the bound, though the patch is small
        await store.update_metadata(thread.id, SCOPES, {"more": "y" * 200})
    with pytest.raises(NotFound):
        await store.update_metadata(thread.id, FOREIGN, {"owner": "mallory"})
    after = await store.get_thread(thread.id, SCOPES)
    assert after.version == thread.version and after.metadata == thread.metadata


async def test_the_list_filters_by_metadata_status_and_update_time(store: Store) -> None:
    alice = await store.create_thread(SCOPE, "a", {"owner": "alice", "n": 1})
    bob = await store.create_thread(SCOPE, "b", {"owner": "bob"})
    both = await store.create_thread(SCOPE, "c", {"owner": "alice", "team": "red"})
    await store.create_thread(FOREIGN[0], "f", {"owner": "alice"})
    await store.create_thread(SCOPE, "n", {"owner": 1})  # not the string "1"

    def ids(threads: list[Any]) -> list[str]:
        return [t.id for t in threads]

    owned = await store.list_threads(SCOPES, query=ThreadQuery(metadata={"owner": "alice"}))
    assert ids(owned) == [both.id, alice.id]
    red = ThreadQuery(metadata={"owner": "alice", "team": "red"})
    assert ids(await store.list_threads(SCOPES, query=red)) == [both.id]
    assert await store.list_threads(SCOPES, query=ThreadQuery(metadata={"owner": "1"})) == []

    await start_run(store, bob.id)
    _, waiting = await start_run(store, both.id)
    await suspend(store, waiting)
    _, done = await start_run(store, alice.id)
    await finish(store, done)
    by_status = {
        status: ids(await store.list_threads(SCOPES, query=ThreadQuery(status=status)))
        for status in ThreadStatus
    }
    assert by_status[ThreadStatus.RUNNING] == [bob.id]
    assert by_status[ThreadStatus.WAITING] == [both.id]
    assert alice.id in by_status[ThreadStatus.IDLE]
    assert bob.id not in by_status[ThreadStatus.IDLE]

    bob_now = await store.get_thread(bob.id, SCOPES)
    newer = ThreadQuery(updated_after=bob_now.updated_at)
    older = ThreadQuery(updated_before=bob_now.updated_at)
    assert bob.id not in ids(await store.list_threads(SCOPES, query=newer))
    assert bob.id not in ids(await store.list_threads(SCOPES, query=older))
    assert {both.id, alice.id} <= set(ids(await store.list_threads(SCOPES, query=newer)))


async def test_pages_are_stable_while_threads_are_created(store: Store) -> None:
    made = [await store.create_thread(SCOPE, f"t{i}", {"owner": "alice"}) for i in range(7)]
    query = ThreadQuery(metadata={"owner": "alice"})
    seen: list[str] = []
    page = await store.list_threads(SCOPES, 3, query)
    for _ in range(len(made)):  # bounded: a cursor that repeats a page must not loop forever
        if not page:
            break
        seen += [t.id for t in page]
        # New threads between pages sort before the cursor: they never shift a later page.
        await store.create_thread(SCOPE, "new", {"owner": "alice"})
        cursor = ThreadQuery(metadata=query.metadata, after=page_cursor(page[-1]))
        page = await store.list_threads(SCOPES, 3, cursor)
    assert seen == [t.id for t in reversed(made)]


@pytest.mark.parametrize("cursor", ["", "not a cursor", "WzFd", "WyJ4IiwxXQ"])
async def test_a_cursor_the_server_did_not_give_is_invalid_input(store: Store, cursor: str) -> None:
    await new_thread(store)
    with pytest.raises(InvalidInput):
        await store.list_threads(SCOPES, query=ThreadQuery(after=cursor or "=="))


@pytest.mark.postgres
@pytest.mark.parametrize("make_sql_store", ["postgres"], indirect=True)
async def test_a_metadata_filter_on_ten_thousand_threads_reads_an_index(
    sql_store: SqlStore,
) -> None:
    """EXPLAIN of the list's own statement: the GIN index of migration 0013, no Seq Scan."""

    async def fill(conn: Any) -> None:
        await conn.execute(
            "INSERT INTO threads (id, scope, title, version, metadata, private_metadata,"
            " created_at, updated_at) SELECT 'th-' || n, $1, 't', 1,"
            ' CASE WHEN n % 1000 = 0 THEN \'{"owner": "alice"}\''
            " ELSE '{\"owner\": \"u' || n || '\"}' END, '{}', n, n"
            " FROM generate_series(1, 10000) AS n",
            SCOPE,
        )
        await conn.execute("ANALYZE threads")

    await sql_store._write(fill)
    query = ThreadQuery(metadata={"owner": "alice"})

    async def explain(conn: Any) -> str:
        sql, args = threads_tx.list_threads_sql(conn, SCOPES, 100, query)
        rows = await conn.fetch(f"EXPLAIN {sql}", *args)
        return "\n".join(str(next(iter(row.values()))) for row in rows)

    plan = await sql_store._read(explain)
    assert "threads_metadata" in plan and "Seq Scan" not in plan, plan
    found = await sql_store.list_threads(SCOPES, 100, query)
    assert [t.id for t in found] == [f"th-{n}" for n in range(10000, 0, -1000)]
