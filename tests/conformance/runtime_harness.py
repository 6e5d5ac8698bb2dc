"""A runtime under test: a store, an in-process bus, a ThreadService and workers, plus a recorder
of everything published for one thread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from realtime.channels import thread_channel
from realtime.memory import MemoryBus
from runtime.agent import Agent
from runtime.domain import (
    Lease,
    MessageView,
    Principal,
    Role,
    RunStatus,
    RunView,
    Snapshot,
    TextPart,
)
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.providers.model_api import ContextMessage
from runtime.service.thread_service import ThreadService
from runtime.storage.store import Store

SCOPE = "acme"
ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({SCOPE}))
BOB = Principal(subject="bob", role=Role.USER, scopes=frozenset({SCOPE}))
BACKEND = Principal(subject="billing-svc", role=Role.BACKEND, scopes=frozenset({SCOPE}))
OUTSIDER = Principal(subject="mallory", role=Role.USER, scopes=frozenset({"other"}))


@dataclass
class Recorder:
    """Every frame published on one thread's channel, decoded, in order."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def chunks(self, run_id: str | None = None) -> list[dict[str, Any]]:
        return [
            f
            for f in self.frames
            if f["type"] == "chunk" and (run_id is None or f["run_id"] == run_id)
        ]

    def text(self, run_id: str | None = None) -> str:
        return "".join(
            f["chunk"]["delta"] for f in self.chunks(run_id) if f["chunk"]["type"] == "text-delta"
        )

    def versions(self) -> list[int]:
        return [f["version"] for f in self.frames if f["type"] == "invalidate"]


class Runtime:
    def __init__(self, store: Store, agent: Agent, *, lease_ttl: float = 5.0) -> None:
        self.store = store
        self.bus = MemoryBus()
        self.agent = agent
        self.service = ThreadService(store, Publisher(self.bus), agent)
        self.lease_ttl = lease_ttl
        self.workers: list[Worker] = []

    async def start_worker(self, **kwargs: Any) -> Worker:
        options = {"lease_ttl": self.lease_ttl, "poll_interval": 0.05, **kwargs}
        worker = Worker(self.store, self.bus, self.agent, **options)
        await worker.start()
        self.workers.append(worker)
        return worker

    @contextlib.asynccontextmanager
    async def record(self, thread_id: str) -> AsyncIterator[Recorder]:
        recorder = Recorder()
        ready = asyncio.Event()

        async def pump() -> None:
            async with self.bus.subscribe(thread_channel(thread_id)) as subscription:
                ready.set()
                async for data in subscription:
                    recorder.raw.append(data)
                    recorder.frames.append(orjson.loads(data))

        task = asyncio.create_task(pump())
        await asyncio.wait_for(ready.wait(), 5)
        try:
            yield recorder
        finally:
            await asyncio.sleep(0.05)  # let the last publishes arrive
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def thread(self, title: str = "t") -> str:
        snapshot = await self.service.create_thread(ALICE, title=title)
        return snapshot.thread.id

    async def wait_for(
        self,
        thread_id: str,
        predicate: Callable[[Snapshot], bool],
        timeout: float = 10.0,
    ) -> Snapshot:
        """Poll committed state until `predicate` holds (bounded)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            snapshot = await self.store.snapshot(thread_id, [SCOPE])
            if predicate(snapshot):
                return snapshot
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out; last snapshot: {snapshot.model_dump()}")
            await asyncio.sleep(0.02)

    async def wait_status(
        self, thread_id: str, *statuses: RunStatus, timeout: float = 10.0
    ) -> Snapshot:
        return await self.wait_for(
            thread_id, lambda s: s.run is not None and s.run.status in statuses, timeout
        )

    async def close(self) -> None:
        for worker in self.workers:
            await worker.stop()
        await self.bus.close()


def settled(snapshot: Snapshot) -> bool:
    return snapshot.run is not None and snapshot.run.status.is_terminal and not snapshot.queue


def run_of(snapshot: Snapshot) -> RunView:
    """The snapshot's run, which the test expects to exist."""
    assert snapshot.run is not None, "the snapshot has no run"
    return snapshot.run


def first_text(message: MessageView | ContextMessage) -> str:
    """The text of a message's first part, which the test expects to be a text part."""
    part = message.parts[0]
    assert isinstance(part, TextPart), part
    return part.text


class GatedLeases:
    """The store, except that the first admin lease waits for `gate` (`waiting` says it has
    asked): others commit between a rewrite's early read and its lease, as a concurrent
    client or rewrite would."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self._first = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        if self._first:
            self._first = False
            self.waiting.set()
            await asyncio.wait_for(self.gate.wait(), 10)
        lease: Lease | None = await self._store.acquire_admin_lease(thread_id, owner, ttl)
        return lease
