"""PresenceHub joins: a burst is written in a few batches, and a leave racing its write leaves
no entry behind (in-process store and bus; the Redis store's own behaviour is conformance)."""

from __future__ import annotations

import asyncio
from typing import Any

from realtime.memory import MemoryBus
from realtime.presence_store import MemoryPresence
from runtime.domain import Principal, Role
from server.live.presence import PresenceHub


class CountingStore(MemoryPresence):
    """The in-process store, counting writes and holding each one until released."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.changed = asyncio.Condition()

    async def put_many(self, entries: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.writes.append(len(entries))
        async with self.changed:
            self.changed.notify_all()
        await self.gate.wait()
        await super().put_many(entries)
        async with self.changed:
            self.changed.notify_all()


def principal(subject: str) -> Principal:
    return Principal(subject=subject, role=Role.USER, scopes=frozenset({"s"}))


async def settle(store: CountingStore, thread_id: str, count: int) -> dict[str, Any]:
    async with asyncio.timeout(5), store.changed:
        await store.changed.wait_for(lambda: len(store._threads.get(thread_id, {})) == count)
    return await store.read(thread_id)


async def test_a_burst_of_joins_is_written_in_a_few_batches() -> None:
    store = CountingStore()
    async with MemoryBus() as bus, PresenceHub(bus, store, refresh_interval=60) as hub:
        members = await asyncio.gather(
            *(hub.join("th-1", principal(f"u{i}"), lambda data: None) for i in range(200))
        )
        entries = await settle(store, "th-1", 200)
        assert set(entries) == {m.id for m in members}
        assert sum(store.writes) == 200 and len(store.writes) <= 3, store.writes


async def test_a_leave_during_its_entrys_write_leaves_nothing_behind() -> None:
    store = CountingStore()
    async with MemoryBus() as bus, PresenceHub(bus, store, refresh_interval=60) as hub:
        stay = await hub.join("th-2", principal("stay"), lambda data: None)
        await settle(store, "th-2", 1)
        store.gate.clear()  # the next write is held in flight
        going = await hub.join("th-2", principal("going"), lambda data: None)
        async with asyncio.timeout(5), store.changed:
            await store.changed.wait_for(lambda: len(store.writes) >= 2)
        leaving = asyncio.create_task(hub.leave(going))
        await asyncio.sleep(0.05)
        assert not leaving.done()  # waits for the write it would otherwise overtake
        store.gate.set()
        await asyncio.wait_for(leaving, 5)
        assert set(await store.read("th-2")) == {stay.id}
