"""The runtime's parsed-message cache (`runtime/engine/message_cache.py`) against both stores:
after appends, tail updates and every kind of history rewrite it returns exactly what
`list_messages` does, reading only the tail while nothing but the tail changed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus, Visibility
from runtime.engine.durable_context import to_context
from runtime.engine.message_cache import HistoryCache
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.storage import SqliteStore, SqlStore
from runtime.storage.sql.sqlite import CHECKPOINT_EVERY
from runtime.storage.store import HistoryRead, SetVisibility, StepCommit, Store, Truncate
from runtime.tools import tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE
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


async def _same(cache: HistoryCache, store: Store, thread_id: str) -> None:
    listed = await store.list_messages(thread_id)
    assert await cache.messages(store, thread_id) == listed
    for anchor in (-1, 0, len(listed) // 2, len(listed) + 5):
        upto = await store.list_messages(thread_id, up_to_position=anchor)
        assert await cache.messages(store, thread_id, anchor) == upto
        assert await cache.context(store, thread_id, anchor) == to_context(upto)


async def test_appends_and_tail_updates_are_tail_reads(store: Store) -> None:
    cache = HistoryCache()
    thread = await new_thread(store)
    assert await cache.messages(store, thread.id) == []
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("one")), assistant(text("two")))))
    await _same(cache, store, thread.id)
    # An empty thread has no tail to read from; from the first message on, reads are tail reads.
    reloads = cache.reloads
    # The tail gets a pending action, then its resolution rewrites the tail's parts.
    await suspend(store, lease, "act-1")
    await _same(cache, store, thread.id)
    await store.resolve_action(thread.id, SCOPES, "act-1", resolution())
    tail = (await cache.messages(store, thread.id))[-1]
    assert tail == (await store.list_messages(thread.id))[-1]
    assert tail.parts[-1].waiting is not None  # type: ignore[union-attr]
    assert tail.parts[-1].waiting.resolution is not None  # type: ignore[union-attr]
    assert cache.reloads == reloads
    # Later runs append after the cached tail.
    await store.start_episode(lease)
    await finish(store, lease)
    await _same(cache, store, thread.id)
    _, lease = await start_run(store, thread.id, text="again")
    await store.commit(lease, StepCommit(append=(assistant(text("three")),)))
    await _same(cache, store, thread.id)
    assert cache.reloads == reloads


async def test_rewrites_reload_the_thread(store: Store) -> None:
    cache = HistoryCache()
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    await finish(store, lease)
    await _same(cache, store, thread.id)
    messages = await store.list_messages(thread.id)
    # Hiding a message before the tail: the cached copy must not keep it visible.
    admin = await store.acquire_admin_lease(thread.id, "admin", 10.0)
    assert admin is not None
    await store.rewrite_history(
        admin, SetVisibility(message_id=messages[1].id, visibility=Visibility.HIDDEN)
    )
    assert [m.visibility for m in await cache.messages(store, thread.id)] == [
        Visibility.VISIBLE,
        Visibility.HIDDEN,
        Visibility.VISIBLE,
    ]
    assert len(await cache.context(store, thread.id, 10)) == 2
    assert cache.reloads == 2
    # Regenerate deletes from a message on and appends nothing yet: the same count of reads
    # from the cached tail position would find nothing, and the epoch says so too.
    await store.rewrite_history(admin, Truncate(from_message_id=messages[1].id, started_by="alice"))
    await store.release_lease(admin)
    await _same(cache, store, thread.id)
    assert [m.id for m in await cache.messages(store, thread.id)] == [messages[0].id]
    assert cache.reloads == 3


async def test_read_history_reads_from_a_position(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    read = await store.read_history(thread.id, 1)
    assert [m.position for m in read.messages] == [1, 2]
    assert read.epoch == 0
    assert (await store.read_history(thread.id, 3)).messages == ()


async def test_begin_episode_is_start_episode_and_its_reads(store: Store) -> None:
    cache = HistoryCache()
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")),)))
    await finish(store, lease)
    assert len(await cache.messages(store, thread.id)) == 2
    admission = await store.submit_input(thread.id, SCOPES, text="next", submitted_by="alice")
    assert admission.run_id is not None
    before = await store.get_run(admission.run_id)
    lease = await store.acquire_run_lease(admission.run_id, "w1", 30.0)
    assert lease is not None
    start = cache.read_from(thread.id)
    assert start == 1  # the cached tail
    began = await store.begin_episode(lease, start)
    assert began.before == before
    assert began.run == await store.get_run(admission.run_id)
    assert (began.run.status.value, began.run.episode) == ("running", before.episode + 1)
    current = await store.get_thread(thread.id, SCOPES)
    assert began.version == current.version
    assert (began.thread.id, began.thread.scope, began.thread.version) == (
        current.id,
        current.scope,
        current.version,
    )
    assert [m.position for m in began.history.messages] == [1, 2]
    assert cache.apply(thread.id, start, began.history) == await store.list_messages(thread.id)
    # A read from a position that is not the cached tail cannot be used.
    assert cache.apply(thread.id, 1, await store.read_history(thread.id, 1)) is None


async def test_begin_episode_reads_like_read_history_from_any_position(store: Store) -> None:
    """From the cached tail (> 0) the read goes with the fence's statement, from 0 in one of
    its own: both read what `read_history` does, with the epoch."""
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    await finish(store, lease)
    admission = await store.submit_input(thread.id, SCOPES, text="c", submitted_by="alice")
    assert admission.run_id is not None
    counts = []
    for start in (0, 1, 3, 4, 9):
        lease = await store.acquire_run_lease(admission.run_id, "w1", 30.0)
        assert lease is not None
        began = await store.begin_episode(lease, start)
        assert began.history == await store.read_history(thread.id, start)
        counts.append(len(began.history.messages))
        await store.release_lease(lease)
    assert counts == [4, 3, 1, 0, 0]


def _count_history_reads(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions `store.read_history` is called from (begin_episode's read is not one)."""
    reads: list[int] = []
    real = store.read_history

    async def counting(thread_id: str, from_position: int = 0) -> HistoryRead:
        reads.append(from_position)
        return await real(thread_id, from_position)

    monkeypatch.setattr(store, "read_history", counting)
    return reads


async def test_first_step_context_is_what_the_episode_start_read(
    runtime_for: RuntimeFactory, sql_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _count_history_reads(sql_store, monkeypatch)
    model = ScriptedModel([text_response("one"), text_response("two")])
    rt = await runtime_for(Agent(model=model))
    thread_id = await rt.thread()
    for count, text_in in ((2, "hi"), (4, "again")):
        await rt.service.send_message(ALICE, thread_id, text_in)
        await rt.wait_for(
            thread_id,
            lambda s, n=count: (
                s.run is not None and s.run.status is RunStatus.COMPLETED and len(s.messages) == n
            ),
        )
    # One-step runs: the episode start's read served each step's context, no read of its own.
    # That read is begin_episode's, or on Postgres the one `start_run` made with the lease
    # (the wakeup named the run's thread): no `read_history` either way.
    assert reads == []
    messages = await sql_store.list_messages(thread_id)
    assert [list(call.messages) for call in model.calls] == [
        to_context(messages[:1]),
        to_context(messages[:3]),
    ]


async def test_a_later_step_reads_what_the_episode_committed(
    runtime_for: RuntimeFactory, sql_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoArgs(BaseModel):
        pass

    @tool
    async def echo(args: NoArgs) -> str:
        return "echoed"

    reads = _count_history_reads(sql_store, monkeypatch)
    model = ScriptedModel([tool_call_response("echo", {}, "c1"), text_response("done")])
    rt = await runtime_for(Agent(model=model, tools=[echo]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    await rt.wait_status(thread_id, RunStatus.COMPLETED, RunStatus.FAILED)
    # The second step's context holds the first step's committed message: read from the tail.
    assert reads == [0]
    messages = await sql_store.list_messages(thread_id)
    assert [list(call.messages) for call in model.calls] == [
        to_context(messages[:1]),
        to_context(messages[:2]),
    ]


def test_cached_context_is_none_for_an_uncached_thread() -> None:
    assert HistoryCache().cached_context("th_unknown", 10) is None


async def test_sqlite_checkpoints_the_wal_off_the_event_loop(tmp_path: Path) -> None:
    """Automatic checkpoints (an fsync at some COMMIT, on the loop) are off; the pool runs a
    PASSIVE one on a thread every CHECKPOINT_EVERY writes, so the WAL does not grow forever."""
    async with SqliteStore(tmp_path / "wal.db") as store:
        for i in range(CHECKPOINT_EVERY):
            await store.create_thread("acme", f"t{i}")
        pending = store.pool._checkpoint  # type: ignore[attr-defined]
        assert pending is not None
        await pending
        reader = sqlite3.connect(tmp_path / "wal.db")
        try:
            # (busy, frames in the WAL, frames checkpointed): all of them already were.
            busy, frames, done = reader.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            assert busy == 0 and frames == done and frames > 0
        finally:
            reader.close()
