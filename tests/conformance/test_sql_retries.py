"""SQL stores only: several processes on one database, transient errors retried, metrics."""

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
from runtime.errors import NotFound, Unavailable
from runtime.storage import PostgresStore, SqliteStore, SqlStore
from runtime.storage.sql.core import Conn
from tests.conformance.store_helpers import (
    SCOPES,
    new_thread,
    start_run,
)

_WRITER = """
import asyncio, sys
from runtime.storage import open_store

async def main(url: str, thread_id: str, tag: str) -> None:
    async with open_store(url) as sql_store:
        for i in range(15):
            await sql_store.submit_input(thread_id, ["acme"], text=f"{tag}-{i}", submitted_by=tag)

asyncio.run(main(*sys.argv[1:]))
"""


def store_url(sql_store: SqlStore) -> str:
    if isinstance(sql_store, SqliteStore):
        return f"sqlite:///{sql_store.path}"
    assert isinstance(sql_store, PostgresStore)
    return sql_store.dsn


async def test_several_processes_write_one_database(sql_store: SqlStore) -> None:
    thread = await new_thread(sql_store)

    def run_writers() -> list[subprocess.CompletedProcess[str]]:
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, store_url(sql_store), thread.id, f"p{n}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(3)
        ]
        return [subprocess.CompletedProcess(w.args, w.wait(60), *w.communicate()) for w in writers]

    for result in await asyncio.to_thread(run_writers):
        assert result.returncode == 0, result.stderr
    assert await version_of(sql_store, thread.id) == 1 + 45
    messages = await sql_store.list_messages(thread.id)
    queue = await sql_store.list_queue(thread.id)
    assert len(messages) + len(queue) == 45


class RecordingCounter:
    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, Any]]] = []

    def add(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self.calls.append((amount, dict(attributes or {})))


def transient_error(sql_store: SqlStore) -> Exception:
    if isinstance(sql_store, SqliteStore):
        return sqlite3.OperationalError("database is locked")
    return ConnectionResetError("connection reset by peer")


def fail_writes(sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """Make the first `failures` write transactions fail after their first write statement,
    i.e. with a partial transaction that must be rolled back before the retry. (On Postgres
    the first write is the key claim sent with BEGIN, `Conn.first_statement`; the writes held
    for COMMIT never go through `execute`.)"""
    real = sql_store._transaction
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
                    raise transient_error(sql_store)

                conn.execute = failing  # type: ignore[method-assign]
                first = conn.first_statement

                async def failing_first(sql: str) -> str | None:
                    status = await first(sql)
                    if status is not None:
                        raise transient_error(sql_store)
                    return status

                conn.first_statement = failing_first  # type: ignore[method-assign]
            yield conn

    monkeypatch.setattr(sql_store, "_transaction", flaky)
    return attempts


async def test_transient_failure_is_retried_and_committed_once(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(sql_store)
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    attempts = fail_writes(sql_store, monkeypatch, failures=1)
    admission = await sql_store.submit_input(thread.id, SCOPES, text="hi", submitted_by="a")
    assert attempts[0] == 2
    assert counter.calls == [(1, {"backend": sql_store.backend})]
    assert admission.version == 2
    assert len(await sql_store.list_messages(thread.id)) == 1
    active = await sql_store.active_run(thread.id)
    assert active is not None and active.id == admission.run_id


async def test_exhausted_retries_raise_unavailable(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await new_thread(sql_store)
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    monkeypatch.setattr(sql_store, "retry_attempts", 3)
    fail_writes(sql_store, monkeypatch, failures=100)
    with pytest.raises(Unavailable) as caught:
        await sql_store.submit_input(thread.id, SCOPES, text="hi", submitted_by="a")
    assert caught.value.code == "unavailable"
    assert len(counter.calls) == 2
    monkeypatch.undo()
    assert await sql_store.list_messages(thread.id) == []
    assert await version_of(sql_store, thread.id) == 1


async def test_domain_errors_are_not_retried(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = RecordingCounter()
    monkeypatch.setattr(instruments, "STORAGE_RETRIES", counter)
    with pytest.raises(NotFound):
        await sql_store.submit_input("th_unknown", SCOPES, text="hi", submitted_by="a")
    assert counter.calls == []


async def test_queue_and_lease_events_are_counted(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_events = RecordingCounter()
    lease_events = RecordingCounter()
    monkeypatch.setattr(instruments, "QUEUE_EVENTS", queue_events)
    monkeypatch.setattr(instruments, "LEASE_EVENTS", lease_events)
    thread = await new_thread(sql_store)
    _, lease = await start_run(sql_store, thread.id)
    await sql_store.submit_input(thread.id, SCOPES, text="later", submitted_by="a")
    await sql_store.renew_lease(lease, 10.0)
    await sql_store.release_lease(lease)
    assert [attrs["event"] for _, attrs in queue_events.calls] == ["admitted", "enqueued"]
    assert [attrs["event"] for _, attrs in lease_events.calls] == [
        "acquired",
        "renewed",
        "released",
    ]
    assert all(attrs["kind"] == "run" for _, attrs in lease_events.calls)


async def version_of(sql_store: SqlStore, thread_id: str) -> int:
    return (await sql_store.get_thread(thread_id, SCOPES)).version
