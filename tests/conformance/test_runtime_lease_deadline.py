"""A worker whose lease renewals hang stops streaming once its lease could have expired by its
own clock, before another worker can take the run over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from runtime.agent import Agent
from runtime.domain import Lease, RunStatus
from runtime.engine.worker import Worker
from runtime.providers.model_api import ModelDelta, ModelRequest
from runtime.providers.scripted import FunctionModel, text_response
from runtime.storage.store import RunLeaseRenewal, Store
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Runtime, first_text, settled

TTL = 0.6


class HangingRenewals:
    """A store whose lease renewals never answer, like storage stuck behind a partition."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        await asyncio.sleep(3600)
        return [RunLeaseRenewal(lease, False) for lease in leases]


async def test_stale_worker_stops_streaming_at_its_local_deadline(
    runtime_for: RuntimeFactory,
) -> None:
    calls: list[int] = []

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        calls.append(len(calls))
        if len(calls) == 1:
            for _ in range(60):  # 3 s of streaming: far past the lease
                yield text_response("stale ")[0]
                await asyncio.sleep(0.05)
        else:
            yield text_response("fresh answer")[0]

    agent = Agent(model=FunctionModel(model))
    rt: Runtime = await runtime_for(agent, workers=0, lease_ttl=TTL)
    stale = Worker(HangingRenewals(rt.store), rt.bus, agent, lease_ttl=TTL, poll_interval=0.05)
    await stale.start()
    rt.workers.append(stale)
    thread_id = await rt.thread()
    loop = asyncio.get_running_loop()
    async with rt.record(thread_id) as rec:
        sent = loop.time()
        admission = await rt.service.send_message(ALICE, thread_id, "hello")
        await rt.wait_status(thread_id, RunStatus.RUNNING)
        stamps: list[float] = []
        while loop.time() - sent < 2 * TTL + 0.5:
            stamps.append(len(rec.chunks(admission.run_id)))
            await asyncio.sleep(0.05)
        await rt.start_worker()
        done = await rt.wait_for(thread_id, settled, timeout=15)
    # The stale worker stopped streaming on its own: the chunk count froze before the end of
    # the observation window (no other worker was running yet).
    assert stamps[-1] == stamps[len(stamps) // 2 + 4], stamps
    assert stamps[-1] < 30
    assert done.run is not None and done.run.status is RunStatus.COMPLETED
    assert [first_text(m) for m in done.messages] == ["hello", "fresh answer"]
