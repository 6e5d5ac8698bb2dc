"""SQL stores only: which statements a store method sends (the reads it saves)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from runtime.domain import (
    Role,
    RunStatus,
)
from runtime.errors import (
    LeaseLost,
)
from runtime.storage import SqlStore
from runtime.storage.sql import runs_tx, threads_tx
from runtime.storage.sql.core import Conn
from runtime.storage.sql.rows import Row
from runtime.storage.store import RunChange, StepCommit
from tests.conformance.conftest import SqlStoreFactory
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    new_thread,
    start_run,
    text,
)
from tests.conformance.test_store import MIGRATIONS


async def test_a_final_step_commit_appends_ends_the_run_and_stores_next_seq_at_once(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit a run-ending step makes (its message, the completion, next_seq): one version,
    the run ended and its lease released, and the tail the append wrote is the one the
    transition checks: not read again (the fence read it; `runs_tx.commit`)."""
    thread = await new_thread(sql_store)
    admission, lease = await start_run(sql_store, thread.id)
    before = await version_of(sql_store, thread.id)
    reads: list[str] = []

    async def counting_tail_row(conn: Conn, thread_id: str) -> Row | None:
        reads.append(thread_id)
        return await threads_tx.tail_row(conn, thread_id)

    monkeypatch.setattr(runs_tx, "tail_row", counting_tail_row)
    change = StepCommit(
        append=(assistant(text("the answer")),),
        run=RunChange(status=RunStatus.COMPLETED),
        next_seq=7,
    )
    committed = await sql_store.commit(lease, change)
    assert committed.version == before + 1 and reads == []
    run = await sql_store.get_run(admission.run_id or "")
    assert run.status is RunStatus.COMPLETED and run.next_seq == 7
    messages = await sql_store.list_messages(thread.id)
    assert [(m.position, m.text(), m.run_id) for m in messages] == [
        (0, messages[0].text(), None),
        (1, "the answer", admission.run_id),
    ]
    # The lease went with the terminal commit: another commit under it is fenced out.
    with pytest.raises(LeaseLost):
        await sql_store.commit(lease, StepCommit(append=(assistant(text("late")),)))


async def version_of(sql_store: SqlStore, thread_id: str) -> int:
    return (await sql_store.get_thread(thread_id, SCOPES)).version


async def test_open_applies_every_migration_once(make_sql_store: SqlStoreFactory) -> None:
    stores = [make_sql_store() for _ in range(3)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        for s in stores:
            assert await s.applied_migrations() == MIGRATIONS
        assert await stores[0].migrate() == []
        assert await stores[0].applied_migrations() == MIGRATIONS
    finally:
        for s in stores:
            await s.close()


async def test_the_reads_around_every_request_are_one_statement_each(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token's principal (every authenticated request), a thread's scope check and its
    version (every subscription): one statement each, with no BEGIN, COMMIT or clock read
    around it (on Postgres each was a transaction: three or four round trips)."""
    thread = await new_thread(sql_store)
    await sql_store.create_token("hash-live", "alice", Role.USER, SCOPES)
    await sql_store.create_token("hash-expired", "bob", Role.USER, SCOPES, expires_in=0.01)
    await asyncio.sleep(0.05)  # past its expiry on the database clock
    sent: list[str] = []
    for name in ("execute", "fetch", "fetchrow", "fetchval"):
        original = getattr(asyncpg.Connection, name)

        def counting(original: Any = original) -> Any:
            async def sends(self: Any, query: str, *args: Any, **kw: Any) -> Any:
                sent.append(query)
                return await original(self, query, *args, **kw)

            return sends

        monkeypatch.setattr(asyncpg.Connection, name, counting())
    principal = await sql_store.principal_for_token("hash-live")
    assert principal is not None and principal.subject == "alice"
    assert await sql_store.principal_for_token("hash-expired") is None
    granted = await sql_store.token_grant("hash-live")  # what the principal cache reads
    assert granted is not None and granted[0] == principal and granted[1] is None
    assert (await sql_store.get_thread(thread.id, SCOPES)).id == thread.id
    assert await sql_store.thread_versions([thread.id]) == {thread.id: thread.version}
    if sql_store.dialect.name == "postgres":
        assert len(sent) == 5, sent
