"""PresenceHub joins: a burst is written in a few batches, and a leave racing a write leaves
no member behind (in-process store and bus; the Redis store's own behaviour is conformance)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

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

    async def write_many(self, values: Sequence[tuple[str, str, bytes | None]]) -> None:
        self.writes.append(len(values))
        async with self.changed:
            self.changed.notify_all()
        await self.gate.wait()
        await super().write_many(values)
        async with self.changed:
            self.changed.notify_all()

    def members(self, thread_id: str) -> set[str]:
        """Every member id written for the thread, whichever gateway wrote it."""
        values = self._threads.get(thread_id, {}).values()
        return {member_id for value in values for member_id in orjson.loads(value)}


def principal(subject: str) -> Principal:
    return Principal(subject=subject, role=Role.USER, scopes=frozenset({"s"}))


async def settle(store: CountingStore, thread_id: str, count: int) -> set[str]:
    async with asyncio.timeout(5), store.changed:
        await store.changed.wait_for(lambda: len(store.members(thread_id)) == count)
    return store.members(thread_id)


async def test_a_burst_of_joins_is_written_in_a_few_batches() -> None:
    store = CountingStore()
    async with MemoryBus() as bus, PresenceHub(bus, store, refresh_interval=60) as hub:
        members = await asyncio.gather(
            *(hub.join("th-1", principal(f"u{i}"), lambda data: None) for i in range(200))
        )
        assert await settle(store, "th-1", 200) == {m.id for m in members}
        assert len(store.writes) <= 3, store.writes  # one value per write, all members in it


async def test_a_leave_during_its_entrys_write_leaves_nothing_behind() -> None:
    store = CountingStore()
    async with MemoryBus() as bus, PresenceHub(bus, store, refresh_interval=60) as hub:
        stay = await hub.join("th-2", principal("stay"), lambda data: None)
        await settle(store, "th-2", 1)
        store.gate.clear()  # the next write is held in flight
        going = await hub.join("th-2", principal("going"), lambda data: None)
        async with asyncio.timeout(5), store.changed:
            await store.changed.wait_for(lambda: len(store.writes) >= 2)
        await hub.leave(going)  # while the value with `going` in it is being written
        store.gate.set()
        assert await settle(store, "th-2", 1) == {stay.id}  # the next write leaves it out
        await hub.leave(stay)
        async with asyncio.timeout(5), store.changed:  # the last leave deletes the value
            await store.changed.wait_for(lambda: "th-2" not in store._threads)
        room = hub._rooms.get("th-2")
        if room is not None and room.writer is not None:  # ... then forgets the room
            await asyncio.wait_for(asyncio.shield(room.writer), 5)
        assert "th-2" not in hub._rooms
