"""Store conformance: a write retried after an unknown COMMIT outcome is not repeated."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from runtime.domain import Resolution, Role, RunStatus
from runtime.errors import LeaseLost
from runtime.storage import SqliteStore, SqlStore
from runtime.storage.sql.core import Conn
from runtime.storage.store import RunChange, StepCommit
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    new_thread,
    start_run,
    suspend,
    text,
)


def _lost_reply(sql_store: SqlStore) -> Exception:
    if isinstance(sql_store, SqliteStore):
        return sqlite3.OperationalError("database is locked")
    return ConnectionResetError("connection reset by peer")


def lose_commit_replies(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch, count: int
) -> list[int]:
    """The next `count` write transactions commit, then raise a transient error as if the
    connection dropped before COMMIT's reply arrived: the outcome looks unknown to the sql_store."""
    real = sql_store._transaction
    lost = [0]

    @asynccontextmanager
    async def committing_then_failing(*, write: bool) -> AsyncIterator[Conn]:
        async with real(write=write) as conn:
            yield conn
        if write and lost[0] < count:
            lost[0] += 1
            raise _lost_reply(sql_store)

    monkeypatch.setattr(sql_store, "_transaction", committing_then_failing)
    return lost


async def test_admission_without_request_id_is_queued_once(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(sql_store)
    await start_run(sql_store, thread.id)
    lost = lose_commit_replies(sql_store, monkeypatch, 2)
    admission = await sql_store.submit_input(thread.id, SCOPES, text="again", submitted_by="alice")
    assert lost == [2]
    queue = await sql_store.list_queue(thread.id)
    assert [item.text for item in queue] == ["again"]
    assert admission.version == (await sql_store.get_thread(thread.id, SCOPES)).version


async def test_step_commit_appends_once(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(sql_store)
    _, lease = await start_run(sql_store, thread.id)
    before = (await sql_store.get_thread(thread.id, SCOPES)).version
    lost = lose_commit_replies(sql_store, monkeypatch, 1)
    version = await sql_store.commit(
        lease, StepCommit(append=(assistant(text("answer")),), next_seq=3)
    )
    assert lost == [1]
    assert version.version == before + 1
    messages = await sql_store.list_messages(thread.id)
    assert [m.role.value for m in messages] == ["user", "assistant"]
    assert (await sql_store.get_run(lease.resource_id)).next_seq == 3


async def test_terminal_commit_replays_its_release_and_admission(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A terminal commit whose reply is lost: the retry returns what the committed attempt did
    (the lease released in its transaction, the queued input admitted once)."""
    thread = await new_thread(sql_store)
    admission, lease = await start_run(sql_store, thread.id)
    queued = await sql_store.submit_input(thread.id, SCOPES, text="next", submitted_by="alice")
    assert queued.queued_item_id is not None
    before = (await sql_store.get_thread(thread.id, SCOPES)).version
    lost = lose_commit_replies(sql_store, monkeypatch, 1)
    version = await sql_store.commit(lease, StepCommit(run=RunChange(status=RunStatus.COMPLETED)))
    assert lost == [1]
    assert version.version == before + 1
    assert version.released and version.admitted
    assert (await sql_store.get_run(admission.run_id or "")).status is RunStatus.COMPLETED
    with pytest.raises(LeaseLost):
        await sql_store.renew_lease(lease, 30.0)
    runnable = await sql_store.find_runnable_runs()
    assert len(runnable) == 1 and runnable[0].id != admission.run_id
    assert [m.text() for m in await sql_store.list_messages(thread.id)] == ["hello", "next"]


async def test_resume_winner_gets_its_own_answer(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(sql_store)
    _, lease = await start_run(sql_store, thread.id)
    await suspend(sql_store, lease, "act-1")
    lost = lose_commit_replies(sql_store, monkeypatch, 1)
    won = Resolution(subject="alice", role=Role.USER, payload={"approved": True}, at=0.0)
    result = await sql_store.resolve_action(thread.id, SCOPES, "act-1", won)
    assert lost == [1]
    # The retry found its own committed resolution: the winner's answer, not a conflict.
    assert result.version == (await sql_store.get_thread(thread.id, SCOPES)).version
    tail = (await sql_store.list_messages(thread.id))[-1]
    waiting = [p.waiting for p in tail.parts if getattr(p, "waiting", None) is not None]
    assert waiting and waiting[0].resolution is not None
    assert waiting[0].resolution.subject == "alice"


async def test_a_write_that_did_not_commit_is_retried(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is claimed inside the transaction: a rolled-back attempt leaves no key behind."""
    thread = await new_thread(sql_store)
    real = sql_store._transaction
    failed = [0]

    @asynccontextmanager
    async def failing_before_commit(*, write: bool) -> AsyncIterator[Conn]:
        async with real(write=write) as conn:
            yield conn
            if write and not failed[0]:
                failed[0] += 1
                raise _lost_reply(sql_store)

    monkeypatch.setattr(sql_store, "_transaction", failing_before_commit)
    admission = await sql_store.submit_input(thread.id, SCOPES, text="hi", submitted_by="alice")
    assert failed == [1]
    assert [m.role.value for m in await sql_store.list_messages(thread.id)] == ["user"]
    assert admission.run_id is not None
