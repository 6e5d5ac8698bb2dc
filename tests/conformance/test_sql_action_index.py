"""Store conformance: the action index finds an action outside the tail without scanning."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest

from runtime.domain import RunStatus
from runtime.errors import ActionConflict, NotFound
from runtime.storage import SqlStore
from runtime.storage.store import StepCommit, Truncate
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    finish,
    new_thread,
    resolution,
    start_run,
    suspend,
    text,
)


async def index_rows(sql_store: SqlStore, thread_id: str) -> dict[str, str]:
    async def read(conn: Any) -> list[Any]:
        return list(
            await conn.fetch(
                "SELECT action_id, message_id FROM message_actions WHERE thread_id = $1",
                thread_id,
            )
        )

    return {row["action_id"]: row["message_id"] for row in await sql_store._read(read)}


async def execute(sql_store: SqlStore, sql: str, *args: Any) -> None:
    async def write(conn: Any) -> None:
        await conn.execute(sql, *args)

    await sql_store._write(write)


async def resolved_and_moved_on(sql_store: SqlStore) -> tuple[str, str]:
    """act-1 resolved by bob, act-2 cancelled by a stop; a later message is the tail now."""
    thread = await new_thread(sql_store)
    admission, lease = await start_run(sql_store, thread.id)
    await suspend(sql_store, lease, "act-1", "act-2")
    await sql_store.resolve_action(thread.id, SCOPES, "act-1", resolution("bob"))
    await sql_store.request_stop(thread.id, SCOPES, admission.run_id or "")
    await finish(sql_store, lease, RunStatus.CANCELLED)
    _, lease = await start_run(sql_store, thread.id, text="next question")
    await sql_store.commit(lease, StepCommit(append=(assistant(text("an answer")),)))
    await finish(sql_store, lease)
    holder = [m.id for m in await sql_store.list_messages(thread.id)][1]
    return thread.id, holder


async def test_the_step_commit_indexes_every_action_of_its_message(sql_store: SqlStore) -> None:
    thread = await new_thread(sql_store)
    _, lease = await start_run(sql_store, thread.id)
    await suspend(sql_store, lease, "act-1", "act-2")
    message_id = (await sql_store.list_messages(thread.id))[-1].id
    assert await index_rows(sql_store, thread.id) == {"act-1": message_id, "act-2": message_id}
    # Nothing else is indexed: a plain reply holds no action.
    other = await new_thread(sql_store)
    _, lease = await start_run(sql_store, other.id)
    await sql_store.commit(lease, StepCommit(append=(assistant(text("hi")),)))
    assert await index_rows(sql_store, other.id) == {}


async def test_an_action_outside_the_tail_is_answered_from_the_index(sql_store: SqlStore) -> None:
    thread_id, holder = await resolved_and_moved_on(sql_store)
    assert set(await index_rows(sql_store, thread_id)) == {"act-1", "act-2"}
    with pytest.raises(ActionConflict) as resolved:
        await sql_store.resolve_action(thread_id, SCOPES, "act-1", resolution("carol"))
    assert resolved.value.details == {"resolved_by": "bob", "state": "cancelled"}
    with pytest.raises(ActionConflict) as cancelled:
        await sql_store.resolve_action(thread_id, SCOPES, "act-2", resolution("carol"))
    assert cancelled.value.details == {"resolved_by": None, "state": "cancelled"}
    # The lookup reads the index, not the messages: without its row the action is unknown
    # (a scan of the thread's messages would still find it in `holder`).
    await execute(sql_store, "DELETE FROM message_actions WHERE action_id = 'act-1'")
    with pytest.raises(NotFound):
        await sql_store.resolve_action(thread_id, SCOPES, "act-1", resolution("carol"))
    assert holder in [m.id for m in await sql_store.list_messages(thread_id)]


async def test_index_rows_go_with_their_messages(sql_store: SqlStore) -> None:
    thread_id, holder = await resolved_and_moved_on(sql_store)
    lease = await sql_store.acquire_admin_lease(thread_id, "admin", 10.0)
    assert lease is not None
    # Regenerating from the holder's position deletes it, and its index rows with it.
    await sql_store.rewrite_history(lease, Truncate(from_message_id=holder, started_by="admin"))
    assert await index_rows(sql_store, thread_id) == {}
    with pytest.raises(NotFound):
        await sql_store.resolve_action(thread_id, SCOPES, "act-1", resolution("carol"))


async def test_the_migration_indexes_messages_written_before_it(sql_store: SqlStore) -> None:
    thread_id, holder = await resolved_and_moved_on(sql_store)
    await execute(sql_store, "DELETE FROM message_actions")
    script = (
        resources.files("runtime.storage.sql")
        .joinpath("migrations", sql_store.dialect.name, "0004_action_index_scope_turns.sql")
        .read_text(encoding="utf-8")
    )
    backfill = script[script.index("INSERT") :].split(";", 1)[0]
    await execute(sql_store, backfill)
    assert await index_rows(sql_store, thread_id) == {"act-1": holder, "act-2": holder}
    with pytest.raises(ActionConflict):
        await sql_store.resolve_action(thread_id, SCOPES, "act-1", resolution("carol"))
