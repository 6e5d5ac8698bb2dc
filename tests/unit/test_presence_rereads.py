"""PresenceHub while idle: its periodic work is a beat and a liveness check per gateway (no
room read or written, nothing aggregated or sent), yet a change or a dead gateway's members'
leaving still reach every member, and a gateway whose beat lapsed comes back (two hubs in
process, one shared in-process store and bus: two gateways)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import orjson

from realtime.bus_support import cancel_and_wait
from realtime.memory import MemoryBus
from realtime.presence_store import MemoryPresence
from runtime.domain import Principal, Role
from server.live.presence import PresenceHub

REFRESH = 0.4


class CountingStore(MemoryPresence):
    """The in-process store, counting what is called of it; a gateway in `lost` does not
    beat (its beats are dropped, as if it stalled)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.readers: list[str] = []  # the gateway of each read_many (the one it skips)
        self.beats = 0
        self.lost: set[str] = set()

    async def beat(self, gateway: str, ttl: float) -> bool:
        if gateway in self.lost:
            return True
        self.beats += 1
        return await super().beat(gateway, ttl)

    async def alive(self, gateways: list[str]) -> set[str]:
        self.calls.append("alive")
        return await super().alive(gateways)

    async def write_many(self, values: Sequence[tuple[str, str, bytes | None]]) -> None:
        self.calls.append("write_many")
        await super().write_many(values)

    async def read_many(self, thread_ids: list[str], skip: str = "") -> dict[str, dict[str, bytes]]:
        self.calls.append("read_many")
        self.readers.append(skip)
        return await super().read_many(thread_ids, skip)


def principal(subject: str) -> Principal:
    return Principal(subject=subject, role=Role.USER, scopes=frozenset({"s"}))


class Seen:
    """What one connection was sent: the frames, and who it sees present."""

    def __init__(self) -> None:
        self.frames: list[dict[str, object]] = []
        self.present: set[str] = set()
        self.changed = asyncio.Event()

    def deliver(self, data: bytes) -> None:
        frame = orjson.loads(data)
        self.frames.append(frame)
        if frame["type"] == "presence":
            self.present = {m["subject"] for m in frame["members"]}
        elif frame["type"] == "presence.join":
            self.present.add(frame["member"]["subject"])
        elif frame["type"] == "presence.leave":
            self.present.discard(frame["subject"])
        self.changed.set()

    async def until(self, predicate: object, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():  # type: ignore[operator]
                self.changed.clear()
                await self.changed.wait()


async def test_an_idle_gateway_only_beats_and_checks_yet_a_dead_gateways_members_vanish() -> None:
    store = CountingStore()
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(MemoryBus())
        a = await stack.enter_async_context(PresenceHub(bus, store, refresh_interval=REFRESH))
        b = PresenceHub(bus, store, refresh_interval=REFRESH)
        await b.__aenter__()
        alice, bob = Seen(), Seen()
        await a.join("th", principal("alice"), alice.deliver)
        await b.join("th", principal("bob"), bob.deliver)
        await alice.until(lambda: alice.present == {"alice", "bob"}, 5)
        await bob.until(lambda: bob.present == {"alice", "bob"}, 5)
        # Idle for several refresh intervals: a beat and a check of the other gateway every
        # half interval, nothing read, written or sent.
        await asyncio.sleep(REFRESH)  # the joins' writes and rereads are over
        sent, rereads, checks, beats = len(alice.frames), a.rereads, a.checks, store.beats
        store.calls.clear()
        await asyncio.sleep(REFRESH * 4)
        assert len(alice.frames) == sent, alice.frames[sent:]
        assert a.checks >= checks + 4 and store.beats >= beats + 8  # two gateways
        assert a.rereads == rereads
        assert set(store.calls) <= {"alive"}, store.calls
        # A change on the other gateway is still seen.
        member = next(iter(b._rooms["th"].members.values()))
        b.update(member, {"typing": True})
        await alice.until(lambda: any(f.get("type") == "presence.update" for f in alice.frames), 5)
        # Gateway b dies: it stops refreshing and never removes its entries.
        assert b._loop_task is not None
        await cancel_and_wait(b._loop_task)
        for room in b._rooms.values():
            await b._stop(room)
        # (Within two refresh intervals: tests/e2e/test_presence.py measures it on real
        # gateways; here the wait is only bounded.)
        await alice.until(lambda: alice.present == {"alice"}, 5)


async def test_a_gateway_whose_beat_lapsed_is_seen_again_when_it_beats_again() -> None:
    store = CountingStore()
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(MemoryBus())
        a = await stack.enter_async_context(PresenceHub(bus, store, refresh_interval=REFRESH))
        b = await stack.enter_async_context(PresenceHub(bus, store, refresh_interval=REFRESH))
        alice, bob = Seen(), Seen()
        await a.join("th", principal("alice"), alice.deliver)
        await b.join("th", principal("bob"), bob.deliver)
        await alice.until(lambda: alice.present == {"alice", "bob"}, 5)
        # b stalls past its beat's expiry (here: its beats are lost), then beats again.
        store.lost.add(b._gateway)
        await alice.until(lambda: alice.present == {"alice"}, 5)
        store.lost.clear()
        await alice.until(lambda: alice.present == {"alice", "bob"}, 5)


async def test_this_gateways_own_changes_are_aggregated_without_a_store_read() -> None:
    store = CountingStore()
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(MemoryBus())
        a = await stack.enter_async_context(PresenceHub(bus, store, refresh_interval=5.0))
        b = await stack.enter_async_context(PresenceHub(bus, store, refresh_interval=5.0))
        bob = Seen()
        await b.join("th", principal("bob"), bob.deliver)
        alice = Seen()
        await a.join("th", principal("alice"), alice.deliver)  # a room new to a: one read
        await alice.until(lambda: alice.present == {"alice", "bob"}, 5)
        # More tabs join, type and leave on gateway a: their frames reach a's members, read
        # from a's own members and the values a last read, not from the store.
        carol = Seen()
        tab = await a.join("th", principal("carol"), carol.deliver)
        await alice.until(lambda: alice.present == {"alice", "bob", "carol"}, 5)
        a.update(tab, {"typing": True})
        await alice.until(lambda: any(f.get("type") == "presence.update" for f in alice.frames), 5)
        await a.leave(tab)
        await alice.until(lambda: alice.present == {"alice", "bob"}, 5)
        assert store.readers.count(a._gateway) == 1, store.calls
        # A change on the other gateway is announced: a reads the store for it.
        member = next(iter(b._rooms["th"].members.values()))
        b.update(member, {"typing": True})
        await alice.until(
            lambda: any(
                f.get("type") == "presence.update" and f["member"]["subject"] == "bob"  # type: ignore[index]
                for f in alice.frames
            ),
            5,
        )
        assert store.readers.count(a._gateway) == 2, store.calls
