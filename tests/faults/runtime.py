"""An in-process runtime for fault scenarios: service and worker on their own Postgres
connections (each through a proxy of the test's), Redis as the bus, and an observer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson

from realtime import connect_bus, open_bus
from realtime.bus import Bus
from realtime.channels import thread_channel
from runtime.agent import Agent
from runtime.demo import demo_agent
from runtime.domain import Principal, Role, Snapshot
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.service.thread_service import ThreadService
from runtime.storage import PostgresStore
from tests.faults.invariants import Observed
from tests.services import require_redis, unique_prefix

SCOPE = "acme"
ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({SCOPE}))
BOB = Principal(subject="bob", role=Role.USER, scopes=frozenset({SCOPE}))


@dataclass
class FaultRuntime:
    service_store: PostgresStore
    worker_store: PostgresStore
    bus: Bus
    service: ThreadService
    worker: Worker
    observed: Observed = field(default_factory=Observed)
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)

    async def watch(self, thread_id: str) -> None:
        """Record every chunk and invalidation published for `thread_id` from now on."""
        ready = asyncio.Event()

        async def pump() -> None:
            async with self.bus.subscribe(thread_channel(thread_id)) as subscription:
                ready.set()
                async for data in subscription:
                    self.observed.record(orjson.loads(data))

        self._watchers.append(asyncio.create_task(pump()))
        await asyncio.wait_for(ready.wait(), 5)

    async def settle(self, thread_id: str, timeout: float = 30.0) -> Snapshot:
        """Committed state once the thread's run ended and its queue is empty, and the worker's
        episode of that run is over (bounded). The end is durable before the episode knows it
        (a COMMIT whose reply was cut goes through, and the retry finds it): what the episode
        publishes then is still to come, and watchers must be there to see it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            snapshot = await self.service_store.snapshot(thread_id, [SCOPE])
            run = snapshot.run
            if (
                run is not None
                and run.status.is_terminal
                and not snapshot.queue
                and run.id not in self.worker.episodes
            ):
                return snapshot
            if loop.time() > deadline:
                raise AssertionError(f"run did not settle: {snapshot.model_dump()}")
            await asyncio.sleep(0.05)

    async def wait_waiting(self, thread_id: str, timeout: float = 30.0) -> Snapshot:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            snapshot = await self.service_store.snapshot(thread_id, [SCOPE])
            if snapshot.run is not None and snapshot.run.status.value == "waiting":
                return snapshot
            if loop.time() > deadline:
                raise AssertionError(f"run did not wait: {snapshot.model_dump()}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def fault_runtime(
    service_dsn: str, worker_dsn: str, *, lease_ttl: float = 6.0, agent: Agent | None = None
) -> AsyncIterator[FaultRuntime]:
    agent = agent or demo_agent()
    bus = open_bus(require_redis(), prefix=unique_prefix())
    await connect_bus(bus, timeout=10)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        service_store = await stack.enter_async_context(PostgresStore(service_dsn, max_size=4))
        worker_store = await stack.enter_async_context(PostgresStore(worker_dsn, max_size=8))
        service = ThreadService(service_store, Publisher(bus), agent)
        worker = Worker(worker_store, bus, agent, lease_ttl=lease_ttl, poll_interval=0.1)
        await worker.start()
        stack.push_async_callback(worker.stop)
        runtime = FaultRuntime(service_store, worker_store, bus, service, worker)
        try:
            yield runtime
        finally:
            for task in runtime._watchers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
