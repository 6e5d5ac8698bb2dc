"""History rewrites racing sends, over SQLite and Postgres through the service: a rewrite is
tied to the version it chose its target from, so an acknowledged send is never deleted."""

from __future__ import annotations

import asyncio

import pytest

from runtime.agent import Agent
from runtime.errors import VersionMismatch
from runtime.providers.scripted import ScriptedModel, text_response
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, SCOPE, GatedLeases, first_text, settled


async def test_an_acknowledged_send_survives_a_racing_regenerate(
    runtime_for: RuntimeFactory,
) -> None:
    """Campaign finding: regenerate chose the reply to remove from one read, then truncated
    from it at whatever version the thread had by the time it held the lease, deleting a send
    acknowledged (and answered) in between. Tied to its read it is refused (409 `conflict`)
    and the send, its answer and the original reply stay.

    Breaks with: ThreadService.regenerate not passing `read_version` to `rewrite`."""
    model = ScriptedModel([text_response("first"), text_response("second"), text_response("again")])
    rt = await runtime_for(Agent(model=model))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "q1")
    await rt.wait_for(thread_id, lambda s: settled(s) and len(s.messages) == 2)
    held = GatedLeases(rt.store)
    rt.service.store = held
    regenerate = asyncio.create_task(rt.service.regenerate(ALICE, thread_id))
    await asyncio.wait_for(held.waiting.wait(), 10)
    admission = await rt.service.send_message(ALICE, thread_id, "q2")  # acknowledged
    await rt.wait_for(thread_id, lambda s: settled(s) and len(s.messages) == 4)
    held.gate.set()
    with pytest.raises(VersionMismatch):
        await regenerate
    rt.service.store = rt.store
    snapshot = await rt.store.snapshot(thread_id, [SCOPE])
    assert [first_text(m) for m in snapshot.messages] == ["q1", "first", "q2", "second"]
    assert snapshot.run is not None and snapshot.run.id == admission.run_id
    # Nothing raced this time: the same regenerate goes through.
    result = await rt.service.regenerate(ALICE, thread_id)
    assert result.removed_message_ids == (snapshot.messages[3].id,)
