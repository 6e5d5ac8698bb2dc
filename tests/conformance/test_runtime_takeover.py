"""Lease takeover: a stalled worker's run is redone by another; the stale worker writes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.agent import Agent
from runtime.domain import Lease, RunStatus
from runtime.providers.scripted import FunctionModel, text_response
from runtime.worker import Worker
from tests.conformance.runtime_harness import ALICE, Runtime, settled


class FrozenHeartbeat:
    """A store whose lease renewals silently do nothing, like a worker stuck in a GC pause."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        return lease


async def test_stalled_worker_is_taken_over_without_loss_or_duplicates(runtime_for) -> None:
    stale_may_finish = asyncio.Event()
    calls: list[int] = []
    stale_started = asyncio.Event()

    async def model(request):  # type: ignore[no-untyped-def]
        calls.append(len(calls))
        if len(calls) == 1:
            stale_started.set()
            yield text_response("stale ")[0]
            await asyncio.wait_for(stale_may_finish.wait(), 20)
            yield text_response("stale answer")[0]
        else:
            yield text_response("fresh answer")[0]

    agent = Agent(model=FunctionModel(model))
    rt: Runtime = await runtime_for(agent, workers=0, lease_ttl=0.6)
    stale = Worker(FrozenHeartbeat(rt.store), rt.bus, agent, lease_ttl=0.6, poll_interval=0.05)  # type: ignore[arg-type]
    await stale.start()
    rt.workers.append(stale)
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        admission = await rt.service.send_message(ALICE, thread_id, "hello")
        await rt.wait_status(thread_id, RunStatus.RUNNING)
        await asyncio.wait_for(stale_started.wait(), 10)
        await rt.start_worker()  # the healthy worker takes over after the lease expires
        done = await rt.wait_for(thread_id, settled, timeout=15)
        stale_may_finish.set()
        await asyncio.sleep(0.3)  # the stale worker now tries to commit and must fail
    snapshot = await rt.wait_for(thread_id, settled)
    assert done.run.status is RunStatus.COMPLETED
    assert [m.parts[0].text for m in snapshot.messages] == ["hello", "fresh answer"]
    assert snapshot.thread.version == done.thread.version
    takeovers = [c for c in rec.chunks(admission.run_id) if c["chunk"]["type"] == "run-takeover"]
    assert len(takeovers) == 1
    versions = rec.versions()
    assert versions == sorted(versions)
    run = await rt.store.get_run(admission.run_id)
    assert run.episode == 2
