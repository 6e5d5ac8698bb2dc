"""SQL stores only: creating a thread, and the one-statement creation's replay by key; a lock
statement carrying the writes held before it."""

from __future__ import annotations

import pytest

from runtime.domain import Thread
from runtime.errors import Conflict
from runtime.storage import SqlStore
from runtime.storage.sql import threads_tx
from runtime.storage.sql.core import Conn
from tests.conformance.store_helpers import SCOPE, SCOPES, counts


async def test_a_thread_id_taken_already_is_a_conflict_that_writes_nothing(
    sql_store: SqlStore,
) -> None:
    first = await sql_store.create_thread(SCOPE, "first", thread_id="th_chosen")
    before = await counts(sql_store)
    with pytest.raises(Conflict):
        await sql_store.create_thread(SCOPE, "second", thread_id="th_chosen")
    assert await counts(sql_store) == before  # not even an idempotency key
    assert await sql_store.get_thread("th_chosen", SCOPES) == first


@pytest.mark.postgres
@pytest.mark.parametrize("make_sql_store", ["postgres"], indirect=True)
async def test_one_statement_creation_replays_after_an_unknown_outcome(
    sql_store: SqlStore,
) -> None:
    """On Postgres a creation is one statement that claims its key: a retry whose first
    attempt committed (same key) answers the thread as that attempt created it, even after
    others changed it, and creates nothing more."""
    assert sql_store.dialect.writing_ctes

    async def call(key: str, thread_id: str, title: str) -> Thread:
        async with sql_store.pool.autocommit() as conn:
            return await threads_tx.create_thread_call(
                conn, key, thread_id, SCOPE, title, '{"a": 1}', "{}", "alice"
            )

    created = await call("tx_create", "th_once", "first")
    assert (created.version, created.title, created.owner) == (1, "first", "alice")
    renamed = await sql_store.rename_thread("th_once", SCOPES, "renamed")
    assert renamed.version == 2
    keys, counter = await counts(sql_store)
    assert await call("tx_create", "th_once", "first") == created  # the lost reply, again
    assert await counts(sql_store) == (keys, counter)
    assert (await sql_store.get_thread("th_once", SCOPES)).title == "renamed"
    with pytest.raises(Conflict):  # a new call for the same id: the thread exists
        await call("tx_other", "th_once", "first")
    assert await counts(sql_store) == (keys, counter)  # the failed statement claimed no key


async def test_a_lock_carries_the_writes_held_before_it(sql_store: SqlStore) -> None:
    """`Conn.lock` sends the writes `execute_later` held (with the lock's statement, where the
    backend holds writes): the transaction's next statement sees them."""
    thread = await sql_store.create_thread(SCOPE, "before")

    async def write_then_lock(conn: Conn) -> object:
        await conn.execute_later("UPDATE threads SET title = $2 WHERE id = $1", thread.id, "held")
        await conn.lock(sql_store.dialect.scope_lock or "SELECT 1 WHERE $1 = $1", SCOPE)
        assert not getattr(conn, "has_pending", False)
        return await conn.fetchval("SELECT title FROM threads WHERE id = $1", thread.id)

    assert await sql_store._write(write_then_lock) == "held"
    assert (await sql_store.get_thread(thread.id, SCOPES)).title == "held"
