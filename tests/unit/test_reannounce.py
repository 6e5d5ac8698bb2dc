"""An invalidation the bus refused is published again once the bus takes it (the newest
version per thread), unless a later one of that thread went out first."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from realtime.bus_errors import BusUnavailableError
from realtime.channels import thread_channel
from realtime.memory import MemoryBus
from realtime.publish_options import PublishOptions
from runtime.engine.publisher import Publisher
from runtime.engine.reannounce import MAX_DELAY, Reannouncer


class FlakyBus(MemoryBus):
    """The in-process bus, refusing every publish while `down`."""

    down = False

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        if self.down:
            raise BusUnavailableError("down")
        await super().publish(channel, data, options)

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        if self.down:
            raise BusUnavailableError("down")
        await super().publish_all(messages, clear_key)


async def versions_seen(bus: MemoryBus, thread_id: str, seen: list[int]) -> None:
    async with bus.subscribe(thread_channel(thread_id)) as subscription:
        async for data in subscription:
            frame = orjson.loads(data)
            if frame["type"] == "invalidate":
                seen.append(frame["version"])


async def test_a_refused_commit_invalidation_goes_out_when_the_bus_is_back() -> None:
    async with FlakyBus() as bus:
        publisher = Publisher(bus)
        seen: list[int] = []
        listener = asyncio.create_task(versions_seen(bus, "thr-1", seen))
        await asyncio.sleep(0.01)
        bus.down = True
        assert not await publisher.committed("thr-1", 4)
        assert not await publisher.invalidate("thr-1", 5)
        await asyncio.sleep(0.3)  # retried, refused again
        bus.down = False
        await asyncio.sleep(MAX_DELAY + 0.5)  # the next retry, at most the backoff's cap
        assert seen == [5]  # only the newest version is owed
        await asyncio.sleep(0.3)
        assert seen == [5]  # and sent once
        listener.cancel()
        await publisher.close()


async def test_a_later_invalidation_settles_what_was_owed() -> None:
    sends: list[dict[str, int]] = []

    async def send(pending: dict[str, int]) -> bool:
        sends.append(pending)
        return False

    owed = Reannouncer(send, first_delay=0.05, max_delay=0.05)
    owed.add("thr-1", 3)
    owed.add("thr-2", 7)
    owed.done("thr-1", 2)  # older than what is owed: still owed
    assert owed.pending == {"thr-1": 3, "thr-2": 7}
    owed.done("thr-1", 4)  # a later one went out
    assert owed.pending == {"thr-2": 7}
    await asyncio.sleep(0.2)
    assert sends and all(s == {"thr-2": 7} for s in sends)
    owed.done("thr-2", 7)
    await asyncio.sleep(0.1)
    count = len(sends)
    await asyncio.sleep(0.15)
    assert len(sends) == count  # nothing owed: no more sends
    await owed.close()


def test_what_is_owed_is_bounded() -> None:
    async def send(pending: dict[str, int]) -> bool:
        return False

    async def fill() -> dict[str, int]:
        owed = Reannouncer(send, max_threads=3)
        for n in range(5):
            owed.add(f"thr-{n}", n)
        pending = owed.pending
        await owed.close()
        return pending

    assert asyncio.run(fill()) == {"thr-2": 2, "thr-3": 3, "thr-4": 4}
