"""A worker announces its commits on the thread's scope channel (the action inbox) without
reading the thread's scope: the episode's start read the thread already."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from realtime.bus_support import cancel_and_wait
from realtime.channels import scope_channel
from runtime.agent import Agent
from runtime.domain import RunStatus
from runtime.engine.worker import Worker
from runtime.providers.scripted import ScriptedModel, text_response
from runtime.storage.store import Store
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, SCOPE, settled


class CountedScopes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self.reads: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]:
        self.reads.append(list(thread_ids))
        result: dict[str, str] = await self._store.thread_scopes(thread_ids)
        return result


async def test_a_workers_runs_on_new_threads_read_no_scope(runtime_for: RuntimeFactory) -> None:
    agent = Agent(model=ScriptedModel([text_response("one"), text_response("two")]))
    rt = await runtime_for(agent, workers=0)
    store = CountedScopes(rt.store)
    worker = Worker(store, rt.bus, agent, poll_interval=0.05)
    await worker.start()
    rt.workers.append(worker)
    announced: set[tuple[str, int]] = set()
    arrived = asyncio.Event()

    async def listen(ready: asyncio.Event) -> None:
        async with rt.bus.subscribe(scope_channel(SCOPE)) as subscription:
            ready.set()
            async for data in subscription:
                announcement = orjson.loads(data)
                announced.add((announcement["thread_id"], announcement["version"]))
                arrived.set()

    ready = asyncio.Event()
    listener = asyncio.create_task(listen(ready))
    await ready.wait()
    try:
        for _ in range(2):
            thread_id = await rt.thread()
            await rt.service.send_message(ALICE, thread_id, "go")
            done = await rt.wait_for(thread_id, settled, timeout=10)
            assert done.run is not None and done.run.status is RunStatus.COMPLETED
            final = done.thread.version
            # The worker's last commit was announced on the scope's channel, scope unread.
            async with asyncio.timeout(5):
                while (thread_id, final) not in announced:
                    arrived.clear()
                    await arrived.wait()
    finally:
        await cancel_and_wait(listener)
    assert store.reads == []
