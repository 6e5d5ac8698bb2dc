"""The `runtime_for` fixture: a runtime (service + workers) over the parametrised `store`; when
the test ends it checks the invariant every runtime conformance test must leave behind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runtime.agent import Agent
from runtime.storage import SqlStore
from runtime.storage.sql.rows import loads
from tests.conformance.runtime_harness import Runtime

RuntimeFactory = Callable[..., Awaitable[Runtime]]

OPEN_TOOL_STATES = ("awaiting-action", "running")


@pytest.fixture
async def runtime_for(sql_store: SqlStore) -> AsyncIterator[RuntimeFactory]:
    runtimes: list[Runtime] = []

    async def factory(agent: Agent, workers: int = 1, **kwargs: Any) -> Runtime:
        rt = Runtime(sql_store, agent, **kwargs)
        await rt.bus.open()
        runtimes.append(rt)
        for _ in range(workers):
            await rt.start_worker()
        return rt

    yield factory
    try:
        # The invariant every runtime conformance test ends on (every one uses this fixture):
        # a terminal run has no tool part awaiting action or running, in any of its messages.
        if runtimes:
            assert await open_tool_parts_of_terminal_runs(sql_store) == []
    finally:
        for rt in runtimes:
            await rt.close()


async def open_tool_parts_of_terminal_runs(store: SqlStore) -> list[tuple[str, str, str, str]]:
    """(run, message, tool call, state) of every open tool part of a terminal run."""
    rows = await store._read(
        lambda conn: conn.fetch(
            "SELECT r.id AS run_id, r.status AS status, m.id AS message_id, m.parts AS parts"
            " FROM messages m JOIN runs r ON r.id = m.run_id"
            " WHERE r.status IN ('completed', 'failed', 'cancelled')"
        )
    )
    found = []
    for row in rows:
        for part in loads(row["parts"]):
            if part.get("type") == "tool-call" and part.get("state") in OPEN_TOOL_STATES:
                call = part["tool_call_id"]
                found.append((row["run_id"], row["message_id"], call, part["state"]))
    return found
