"""A worker renews the leases of all its running episodes together, one storage call per beat
(runtime/engine/renewals.py), and a stop request the bus never delivered is noticed at a beat."""

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
from tests.conformance.runtime_harness import ALICE, SCOPE, Runtime, first_text, settled

TTL = 0.6  # a beat every 0.2 s


class CountedRenewals:
    """The store, with every `renew_run_leases` call's leases recorded."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        self.calls.append([lease.resource_id for lease in leases])
        result: list[RunLeaseRenewal] = await self._store.renew_run_leases(leases, ttl)
        return result


def streaming(tokens: int, pause: float) -> Agent:
    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        for n in range(tokens):
            yield text_response(f"t{n} ")[0]
            await asyncio.sleep(pause)

    return Agent(model=FunctionModel(model))


async def counted_worker(rt: Runtime, agent: Agent) -> CountedRenewals:
    store = CountedRenewals(rt.store)
    worker = Worker(store, rt.bus, agent, lease_ttl=TTL, poll_interval=0.05)
    await worker.start()
    rt.workers.append(worker)
    return store


async def test_the_runs_of_a_worker_renew_their_leases_together(
    runtime_for: RuntimeFactory,
) -> None:
    agent = streaming(tokens=30, pause=0.05)  # 1.5 s each: several beats
    rt = await runtime_for(agent, workers=0, lease_ttl=TTL)
    store = await counted_worker(rt, agent)
    threads = [await rt.thread() for _ in range(6)]
    for thread_id in threads:  # started apart: more than a batch's window, less than a beat
        await rt.service.send_message(ALICE, thread_id, "go")
        await asyncio.sleep(0.07)
    done = [await rt.wait_for(thread_id, settled, timeout=20) for thread_id in threads]
    assert all(d.run is not None and d.run.status is RunStatus.COMPLETED for d in done)
    assert all(first_text(d.messages[-1]).startswith("t0 t1 ") for d in done)
    renewed = [run_id for call in store.calls for run_id in call]
    assert all(len(set(call)) == len(call) for call in store.calls)  # one ask per lease
    # Six runs of ~1.5 s, a beat every 0.2 s: each renewed several times, in shared calls.
    assert len(set(renewed)) == 6, store.calls
    assert len(renewed) >= 2 * len(store.calls), store.calls


async def test_a_stop_the_bus_never_delivered_is_noticed_at_a_beat(
    runtime_for: RuntimeFactory,
) -> None:
    agent = streaming(tokens=200, pause=0.05)  # 10 s unless stopped
    rt = await runtime_for(agent, workers=0, lease_ttl=TTL)
    store = await counted_worker(rt, agent)
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "go")
    assert admission.run_id is not None
    await rt.wait_status(thread_id, RunStatus.RUNNING)
    # Storage only: no stop signal is published on the bus.
    await rt.store.request_stop(thread_id, [SCOPE], admission.run_id)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    done = await rt.wait_for(thread_id, settled, timeout=10)
    assert done.run is not None and done.run.status is RunStatus.CANCELLED
    # Within a beat or two (0.2 s apart, the first at most 0.3 s after the last), not at the
    # model's end.
    assert loop.time() - asked < 2.0
    assert any(admission.run_id in call for call in store.calls)
