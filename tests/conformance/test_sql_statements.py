"""SQL stores only: which statements a store method sends (the reads it saves)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import (
    RunStatus,
)
from runtime.errors import (
    LeaseLost,
)
from runtime.storage import SqlStore
from runtime.storage.sql import runs_tx
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
    real_tail_row = runs_tx.tail_row

    async def counting_tail_row(conn: object, thread_id: str) -> object:
        reads.append(thread_id)
        return await real_tail_row(conn, thread_id)  # type: ignore[arg-type]

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
