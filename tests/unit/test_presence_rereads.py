"""PresenceHub rereads: an idle room's periodic reread sends and aggregates nothing, yet a
change or a dead gateway's expired entries still reach every member (two hubs in process, one
shared in-process store and bus: two gateways)."""

from __future__ import annotations

import asyncio
import contextlib

import orjson

from realtime.bus_support import cancel_and_wait
from realtime.memory import MemoryBus
from realtime.presence_store import MemoryPresence
from runtime.domain import Principal, Role
from server.live.presence import PresenceHub

REFRESH = 0.4


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


async def test_idle_rereads_send_nothing_and_a_dead_gateways_members_still_vanish() -> None:
    store = MemoryPresence()
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
        # Idle for several refreshes (each moves every entry's expiry): nothing is sent and
        # the rereads skip the aggregation.
        sent, rereads, skipped = len(alice.frames), a.rereads, a.rereads_skipped
        await asyncio.sleep(REFRESH * 4)
        assert len(alice.frames) == sent, alice.frames[sent:]
        assert a.rereads >= rereads + 4  # every half interval
        assert a.rereads_skipped - skipped == a.rereads - rereads
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
