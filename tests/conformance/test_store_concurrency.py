"""Store conformance: concurrent writers, several processes on one database, retries, metrics."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from runtime import instruments
from runtime.domain import InputPolicy
from runtime.errors import NotFound, Unavailable
from runtime.storage import PostgresStore, SqliteStore, SqlStore
from runtime.storage.sql.core import Conn
from runtime.storage.store import StepCommit
from tests.conformance.conftest import StoreFactory
from tests.conformance.store_helpers import (
    SCOPES,
    assert_contiguous,
    assistant,
    new_thread,
    start_run,
    text,
)


async def version_of(store: SqlStore, thread_id: str) -> int:
    return (await store.get_thread(thread_id, SCOPES)).version


async def test_concurrent_writers_lose_nothing_and_versions_have_no_gaps(store: SqlStore) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    doomed = [
        await store.submit_input(thread.id, SCOPES, text=f"doomed {i}", submitted_by="a")
        for i in range(5)
    ]
    start = await version_of(store, thread.id)
    submits = [
        store.submit_input(thread.id, SCOPES, text=f"queued {i}", submitted_by="bob")
        for i in range(8)
    ]
    commits = [
        store.commit(lease, StepCommit(append=(assistant(text(f"step {i}")),))) for i in range(7)
    ]
    cancels = [
        store.cancel_queued_item(thread.id, SCOPES, item.queued_item_id or "") for item in doomed
    ]
    results = await asyncio.gather(*submits, *commits, *cancels)
    versions = [r if isinstance(r, int) else r.version for r in results]
    assert_contiguous(versions, start)
    assert await version_of(store, thread.id) == start + 20
    messages = await store.list_messages(thread.id)
    assert sorted(m.text() for m in messages[1:]) == sorted(f"step {i}" for i in range(7))
    assert [m.position for m in messages] == list(range(8))
    queue = await store.list_queue(thread.id)
    assert sorted(q.text for q in queue) == sorted(f"queued {i}" for i in range(8))


async def test_concurrent_submits_on_an_idle_thread_start_one_run(store: SqlStore) -> None:
    thread = await new_thread(store)
    results = await asyncio.gather(
        *(store.submit_input(thread.id, SCOPES, text=f"m{i}", submitted_by="a") for i in range(12))
    )
    assert_contiguous([r.version for r in results], 1)
    assert sum(r.run_id is not None for r in results) == 1
    assert sum(r.queued_item_id is not None for r in results) == 11
    assert len(await store.list_messages(thread.id)) == 1


async def test_concurrent_duplicates_create_one_admission(store: SqlStore) -> None:
    thread = await new_thread(store)
    results = await asyncio.gather(
        *(
            store.submit_input(
                thread.id, SCOPES, text="once", submitted_by="a", client_request_id="same"
            )
            for _ in range(10)
        )
    )
    originals = [r for r in results if not r.duplicate]
    assert len(originals) == 1
    assert {r.message_id for r in results} == {originals[0].message_id}
    assert await version_of(store, thread.id) == 2


async def test_concurrent_lease_acquisition_has_one_winner(store: SqlStore) -> None:
    thread = await new_thread(store)
    admission = await store.submit_input(thread.id, SCOPES, text="go", submitted_by="a")
    leases = await asyncio.gather(
        *(store.acquire_run_lease(admission.run_id or "", f"w{i}", 10.0) for i in range(10))
    )
    assert sum(lease is not None for lease in leases) == 1


async def test_two_store_instances_share_one_database(make_store: StoreFactory) -> None:
    async with make_store() as one, make_store() as two:
        thread = await new_thread(one)
        results = await asyncio.gather(
            *(
                (one if i % 2 else two).submit_input(
                    thread.id, SCOPES, text=f"m{i}", submitted_by="a", policy=InputPolicy.ENQUEUE
                )
                for i in range(20)
            )
        )
        assert_contiguous([r.version for r in results], 1)
        assert await version_of(two, thread.id) == 21


_WRITER = """
import asyncio, sys
from runtime.storage import open_store

async def main(url: str, thread_id: str, tag: str) -> None:
    async with open_store(url) as store:
        for i in range(15):
            await store.submit_input(thread_id, ["acme"], text=f"{tag}-{i}", submitted_by=tag)

asyncio.run(main(*sys.argv[1:]))
"""


def store_url(store: SqlStore) -> str:
    if isinstance(store, SqliteStore):
        return f"sqlite:///{store.path}"
    assert isinstance(store, PostgresStore)
    return store.dsn


async def test_several_processes_write_one_database(store: SqlStore) -> None:
    thread = await new_thread(store)

    def run_writers() -> list[subprocess.CompletedProcess[str]]:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, store_url(store), thread.id, f"p{n}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(3)
        ]
        return [subprocess.CompletedProcess(w.args, w.wait(60), *w.communicate()) for w in writers]

    for result in await asyncio.to_thread(run_writers):
        assert result.returncode == 0, result.stderr
    assert await version_of(store, thread.id) == 1 + 45
    messages = await store.list_messages(thread.id)
    queue = await store.list_queue(thread.id)
    assert len(messages) + len(queue) == 45


# --- retries ------------------------------------------------------------------------------


class RecordingCounter:
    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, Any]]] = []

    def add(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self.calls.append((amount, dict(attributes or {})))


def transient_error(store: SqlStore) -> Exception:
    if isinstance(store, SqliteStore):
        return sqlite3.OperationalError("database is locked")
    return ConnectionResetError("connection reset by peer")


def fail_writes(store: SqlStore, monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """Make the first `failures` write transactions fail after their first write statement,
    i.e. with a partial transaction that must be rolled back before the retry. (On Postgres
    the first write is the key claim sent with BEGIN, `Conn.first_statement`; the writes held
    for COMMIT never go through `execute`.)"""
    real = store._transaction
    attempts = [0]

    @asynccontextmanager
    async def flaky(*, write: bool) -> AsyncIterator[Conn]:
        async with real(write=write) as conn:
            if write:
                attempts[0] += 1
            if write and attempts[0] <= failures:
                original = conn.execute

                async def failing(sql: str, *args: Any) -> None:
                    await original(sql, *args)
                    raise transient_error(store)

                conn.execute = failing  # type: ignore[method-assign]
                first = conn.first_statement

                async def failing_first(sql: str) -> str | None:
                    status = await first(sql)
                    if status is not None:
                        raise transient_error(store)
                    return status

                conn.first_statement = failing_first  # type: ignore[method-assign]
            yield conn

    monkeypatch.setattr(store, "_transaction", flaky)
    return attempts


async def test_transient_failure_is_retried_and_committed_once(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(store)
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    attempts = fail_writes(store, monkeypatch, failures=1)
    admission = await store.submit_input(thread.id, SCOPES, text="hi", submitted_by="a")
    assert attempts[0] == 2
    assert counter.calls == [(1, {"backend": store.backend})]
    assert admission.version == 2
    assert len(await store.list_messages(thread.id)) == 1
    active = await store.active_run(thread.id)
    assert active is not None and active.id == admission.run_id


async def test_exhausted_retries_raise_unavailable(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(store)
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    monkeypatch.setattr(store, "retry_attempts", 3)
    fail_writes(store, monkeypatch, failures=100)
    with pytest.raises(Unavailable) as caught:
        await store.submit_input(thread.id, SCOPES, text="hi", submitted_by="a")
    assert caught.value.code == "unavailable"
    assert len(counter.calls) == 2
    monkeypatch.undo()
    assert await store.list_messages(thread.id) == []
    assert await version_of(store, thread.id) == 1


async def test_domain_errors_are_not_retried(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    with pytest.raises(NotFound):
        await store.submit_input("th_unknown", SCOPES, text="hi", submitted_by="a")
    assert counter.calls == []


async def test_queue_and_lease_events_are_counted(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_events = RecordingCounter()
    lease_events = RecordingCounter()
    monkeypatch.setattr(instruments, "QUEUE_EVENTS", queue_events)
    monkeypatch.setattr(instruments, "LEASE_EVENTS", lease_events)
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.submit_input(thread.id, SCOPES, text="later", submitted_by="a")
    await store.renew_lease(lease, 10.0)
    await store.release_lease(lease)
    assert [attrs["event"] for _, attrs in queue_events.calls] == ["admitted", "enqueued"]
    assert [attrs["event"] for _, attrs in lease_events.calls] == [
        "acquired",
        "renewed",
        "released",
    ]
    assert all(attrs["kind"] == "run" for _, attrs in lease_events.calls)
