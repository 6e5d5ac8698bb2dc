"""Hub conformance over every bus: one subscription per thread, shared bytes, resync, polling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import orjson
import pytest

from realtime.bus import Bus
from realtime.bus_errors import BusClosedError
from realtime.channels import replay_key, thread_channel
from realtime.envelopes import ChunkEnvelope, InvalidateEnvelope, MessageKind, encode
from realtime.hub import Hub, ListenerLike
from realtime.memory import MemoryBus
from realtime.outbox import Outbox
from realtime.redis import RedisBus
from tests.conformance.conftest_bus import (
    BACKENDS,
    admin_redis,
    client_ids,
    eventually,
    numsub,
    open_test_bus,
    subscription_count,
    within,
)

Received = tuple[bytes, MessageKind, int | None]


class Recorder:
    """A listener that records what it gets (the gateway's outbox adapter in real use)."""

    def __init__(self) -> None:
        self.received: list[Received] = []

    def deliver(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        self.received.append((data, kind, version))

    def kinds(self) -> list[MessageKind]:
        return [kind for _, kind, _ in self.received]


@asynccontextmanager
async def listening(hub: Hub, *registrations: tuple[str, ListenerLike]) -> AsyncIterator[None]:
    """Registers (thread, listener) pairs with `Hub.add` for the block, as a session does."""
    for thread_id, listener in registrations:
        await hub.add(thread_id, listener)
    try:
        yield
    finally:
        for thread_id, listener in registrations:
            await hub.remove(thread_id, listener)


async def publish_invalidate(bus: Bus, thread_id: str, version: int) -> None:
    frame = encode(InvalidateEnvelope(thread_id=thread_id, version=version))
    await bus.publish(thread_channel(thread_id), frame)


class FakeVersions:
    """Stands in for `store.thread_versions`: versions the test moves by hand."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.calls: list[list[str]] = []

    async def __call__(self, thread_ids: Sequence[str]) -> Mapping[str, int]:
        self.calls.append(list(thread_ids))
        return {t: self.versions[t] for t in thread_ids if t in self.versions}


class FlakyBus(MemoryBus):
    """A memory bus whose health the test controls, and that can 'reconnect'."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    @property
    def healthy(self) -> bool:
        return not self.down and super().healthy

    async def come_back(self) -> None:
        self.down = False
        await self._listeners.notify()


@pytest.fixture(params=BACKENDS)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    async with open_test_bus(request.param) as opened:
        yield opened


@pytest.fixture
async def hub(bus: Bus) -> AsyncIterator[Hub]:
    async with Hub(bus) as opened:
        yield opened


def chunk_frame(thread_id: str, seq: int, episode: int = 1, run_id: str = "run") -> bytes:
    return encode(
        ChunkEnvelope(
            thread_id=thread_id,
            run_id=run_id,
            seq=seq,
            episode=episode,
            chunk={"type": "text-delta", "delta": "x"},
        )
    )


async def test_one_bus_subscription_per_thread_whatever_the_listeners(bus: Bus, hub: Hub) -> None:
    channel = thread_channel("t1")
    listeners = [Recorder(), Recorder(), Recorder()]
    for listener in listeners:
        await within(hub.add("t1", listener))
    assert subscription_count(bus, channel) == 1
    assert hub.listener_count("t1") == 3
    await hub.remove("t1", listeners[0])
    await hub.remove("t1", listeners[1])
    assert subscription_count(bus, channel) == 1
    await within(hub.remove("t1", listeners[2]))
    assert subscription_count(bus, channel) == 0
    assert hub.watched_threads == []


async def test_redis_sees_one_subscriber_for_a_watched_thread() -> None:
    async with open_test_bus("redis") as bus, Hub(bus) as hub, admin_redis() as admin:
        assert isinstance(bus, RedisBus)
        channel = bus.prefix + thread_channel("t1")
        async with listening(hub, ("t1", Recorder()), ("t1", Recorder())):
            await hub.add("t1", extra := Recorder())
            assert await numsub(admin, channel) == 1
            await hub.remove("t1", extra)
            assert await numsub(admin, channel) == 1


async def test_every_listener_gets_the_same_bytes_object(bus: Bus, hub: Hub) -> None:
    listeners = [Recorder(), Recorder(), Recorder()]
    for listener in listeners:
        await hub.add("t1", listener)
    frame = chunk_frame("t1", 0)
    await bus.publish(thread_channel("t1"), frame)
    await eventually(lambda: all(listener.received for listener in listeners))
    objects = [listener.received[0][0] for listener in listeners]
    assert objects[0] == frame
    assert all(obj is objects[0] for obj in objects)
    assert listeners[0].received[0][1:] == ("chunk", None)


async def test_messages_are_classified_once_for_listeners(bus: Bus, hub: Hub) -> None:
    recorder = Recorder()
    async with listening(hub, ("t1", recorder)):
        await bus.publish(thread_channel("t1"), chunk_frame("t1", 0))
        await publish_invalidate(bus, "t1", 4)
        await publish_invalidate(bus, "t1", 3)  # older than what was seen: not delivered
        await bus.publish(thread_channel("t1"), b"not json")  # dropped, never delivered
        await bus.publish(thread_channel("t1"), b'{"type": "surprise"}')
        await publish_invalidate(bus, "t1", 5)
        await eventually(lambda: len(recorder.received) == 3)
    assert [(kind, version) for _, kind, version in recorder.received] == [
        ("chunk", None),
        ("invalidate", 4),
        ("invalidate", 5),
    ]
    assert orjson.loads(recorder.received[2][0]) == {
        "type": "invalidate",
        "thread_id": "t1",
        "version": 5,
    }


async def test_threads_are_delivered_separately(bus: Bus, hub: Hub) -> None:
    one, two = Recorder(), Recorder()
    async with listening(hub, ("one", one), ("two", two)):
        await bus.publish(thread_channel("one"), chunk_frame("one", 0))
        await bus.publish(thread_channel("two"), chunk_frame("two", 0))
        await eventually(lambda: bool(one.received and two.received))
        await asyncio.sleep(0.05)
    assert [data for data, _, _ in one.received] == [chunk_frame("one", 0)]
    assert [data for data, _, _ in two.received] == [chunk_frame("two", 0)]


async def test_plain_callables_and_outboxes_are_listeners(bus: Bus, hub: Hub) -> None:
    seen: list[Received] = []
    outbox = Outbox(max_bytes=10_000)

    def into_outbox(data: bytes, kind: MessageKind, version: int | None) -> None:
        outbox.put(data, kind, "t1", version)  # whether it queued is the outbox's to decide

    async with listening(
        hub,
        ("t1", lambda data, kind, version: seen.append((data, kind, version))),
        ("t1", into_outbox),
    ):
        await publish_invalidate(bus, "t1", 1)
        await publish_invalidate(bus, "t1", 2)
        await eventually(lambda: len(seen) == 2)
    assert await within(outbox.get()) == encode(InvalidateEnvelope(thread_id="t1", version=2))
    assert outbox.get_nowait() is None  # coalesced: only the latest version is sent


async def test_a_failing_listener_does_not_starve_the_others(bus: Bus, hub: Hub) -> None:
    def broken(data: bytes, kind: MessageKind, version: int | None) -> None:
        raise RuntimeError("listener bug")

    recorder = Recorder()
    async with listening(hub, ("t1", broken), ("t1", recorder)):
        await bus.publish(thread_channel("t1"), chunk_frame("t1", 0))
        await eventually(lambda: bool(recorder.received))


async def test_replay_for_late_joiners(bus: Bus, hub: Hub) -> None:
    for seq in range(3):
        await bus.append_replay(replay_key("t1"), chunk_frame("t1", seq), limit=10)
    frames = await within(hub.replay("t1"))
    assert [orjson.loads(f)["seq"] for f in frames] == [0, 1, 2]
    await bus.clear_replay(replay_key("t1"))
    assert await within(hub.replay("t1")) == []


async def test_a_superseded_episode_is_dropped_live_and_from_the_replay(bus: Bus, hub: Hub) -> None:
    # A worker that lost its lease (stalled, then resumed) may still publish after the new
    # owner's first chunk: listeners and late joiners must not see it.
    recorder = Recorder()
    sent = [
        chunk_frame("t1", 0, episode=1),
        chunk_frame("t1", 0, episode=2),  # the takeover redoes the step from seq 0
        chunk_frame("t1", 1, episode=1),  # the stale worker again: void
        chunk_frame("t1", 0, episode=1, run_id="other"),  # another run is independent
        chunk_frame("t1", 1, episode=2),
    ]
    async with listening(hub, ("t1", recorder)):
        for data in sent:
            await bus.publish(thread_channel("t1"), data)
            await bus.append_replay(replay_key("t1"), data, limit=10)
        await eventually(lambda: len(recorder.received) == 4)
        await asyncio.sleep(0.05)
    assert [data for data, _, _ in recorder.received] == [sent[0], sent[1], sent[3], sent[4]]
    assert await within(hub.replay("t1")) == [sent[1], sent[3], sent[4]]


async def test_a_takeover_outlives_the_threads_last_listener(bus: Bus, hub: Hub) -> None:
    # Campaign seed 7: the newest episode was remembered with the listener set, so once the
    # thread's last listener left, a client subscribing again got the stale worker's chunks.
    first, second = Recorder(), Recorder()
    async with listening(hub, ("t1", first)):
        await bus.publish(thread_channel("t1"), chunk_frame("t1", 0, episode=2))
        await eventually(lambda: len(first.received) == 1)
    assert hub.watched_threads == []
    stale, current = chunk_frame("t1", 1, episode=1), chunk_frame("t1", 1, episode=2)
    async with listening(hub, ("t1", second)):
        await bus.publish(thread_channel("t1"), stale)
        await bus.publish(thread_channel("t1"), current)
        await eventually(lambda: len(second.received) >= 1)
    assert [data for data, _, _ in second.received] == [current]


async def test_a_takeover_seen_only_in_the_replay_voids_the_stale_workers_live_chunks(
    bus: Bus, hub: Hub
) -> None:
    # Campaign seed 50 (cluster): the new owner's first chunks were published before this hub
    # subscribed (or during a bus gap), so a listener learnt of the takeover from the replay;
    # the thawed stale worker's next live chunk then passed the hub.
    await bus.append_replay(replay_key("t1"), chunk_frame("t1", 0, episode=2), limit=10)
    recorder = Recorder()
    stale, current = chunk_frame("t1", 1, episode=1), chunk_frame("t1", 1, episode=2)
    async with listening(hub, ("t1", recorder)):
        assert await within(hub.replay("t1")) == [chunk_frame("t1", 0, episode=2)]
        await bus.publish(thread_channel("t1"), stale)
        await bus.publish(thread_channel("t1"), current)
        await eventually(lambda: len(recorder.received) >= 1)
    assert [data for data, _, _ in recorder.received] == [current]


async def test_hub_reports_bus_health(bus: Bus, hub: Hub) -> None:
    before = hub.healthy
    await bus.close()
    assert (before, hub.healthy) == (True, False)
    assert await within(hub.replay("t1")) == []  # a bus failure is not the gateway's problem


async def test_close_releases_every_subscription(bus: Bus) -> None:
    hub = Hub(bus)
    await hub.open()
    await hub.add("a", Recorder())
    await hub.add("b", Recorder())
    await within(hub.close())
    assert subscription_count(bus, thread_channel("a")) == 0
    assert subscription_count(bus, thread_channel("b")) == 0
    with pytest.raises(RuntimeError):
        await hub.add("a", Recorder())


async def test_a_cancelled_add_leaves_nothing_behind(bus: Bus, hub: Hub) -> None:
    task = asyncio.create_task(hub.add("t1", Recorder()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task)
    assert hub.watched_threads == []
    await eventually(lambda: subscription_count(bus, thread_channel("t1")) == 0)


# -- fallbacks: gaps, unhealthy bus, reconnects -------------------------------------------------


async def test_a_gap_in_the_bus_subscription_becomes_a_resync_notice() -> None:
    async with MemoryBus(max_queue=3) as bus, Hub(bus) as hub:
        recorder = Recorder()
        await hub.add("t1", recorder)
        # No await that yields between publishes: the hub cannot drain, its queue overflows.
        for seq in range(10):
            await bus.publish(thread_channel("t1"), chunk_frame("t1", seq))
        await eventually(lambda: len(recorder.received) == 4)
    assert recorder.kinds() == ["resync", "chunk", "chunk", "chunk"]
    assert orjson.loads(recorder.received[0][0]) == {"type": "resync", "thread_id": "t1"}


async def test_versions_are_polled_only_while_the_bus_is_unhealthy() -> None:
    versions = FakeVersions()
    versions.versions = {"t1": 3, "t2": 8}
    async with (
        FlakyBus() as bus,
        Hub(bus, version_source=versions, poll_interval=0.02) as hub,
    ):
        one, two = Recorder(), Recorder()
        await hub.add("t1", one)
        await hub.add("t2", two)
        await publish_invalidate(bus, "t1", 3)
        await eventually(lambda: bool(one.received))
        await asyncio.sleep(0.1)
        assert versions.calls == []  # healthy bus: no polling

        bus.down = True
        await eventually(lambda: len(versions.calls) >= 1)
        await eventually(lambda: bool(two.received))
        assert two.received[-1][1:] == ("invalidate", 8)  # no baseline yet: sent once
        assert one.kinds() == ["invalidate"]  # t1 is still at 3, already seen

        versions.versions["t1"] = 4
        await eventually(lambda: len(one.received) == 2)
        assert one.received[-1][1:] == ("invalidate", 4)
        assert orjson.loads(one.received[-1][0]) == {
            "type": "invalidate",
            "thread_id": "t1",
            "version": 4,
        }
        calls = len(versions.calls)
        await eventually(lambda: len(versions.calls) >= calls + 3)
        assert len(one.received) == 2 and len(two.received) == 1  # unchanged: nothing new

        # The bus is back: a resync notice and one more poll catch up on what was missed.
        versions.versions["t2"] = 9
        await bus.come_back()
        await eventually(lambda: len(two.received) == 3)
        assert two.kinds() == ["invalidate", "resync", "invalidate"]
        assert two.received[-1][2] == 9
        assert one.kinds()[-1] == "resync"
        await asyncio.sleep(0.1)
        calls = len(versions.calls)
        await asyncio.sleep(0.1)
        assert len(versions.calls) == calls  # healthy again: polling stopped


async def test_a_failing_version_source_does_not_stop_polling() -> None:
    attempts: list[int] = []

    async def flaky_source(thread_ids: Sequence[str]) -> Mapping[str, int]:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("store unavailable")
        return dict.fromkeys(thread_ids, 1)

    async with FlakyBus() as bus, Hub(bus, version_source=flaky_source, poll_interval=0.01) as hub:
        recorder = Recorder()
        await hub.add("t1", recorder)
        bus.down = True
        await eventually(lambda: bool(recorder.received))
    assert recorder.received[0][1:] == ("invalidate", 1)


async def test_redis_reconnect_tells_listeners_to_resync() -> None:
    versions = FakeVersions()
    async with (
        open_test_bus("redis") as bus,
        Hub(bus, version_source=versions, poll_interval=0.02) as hub,
        admin_redis() as admin,
    ):
        assert isinstance(bus, RedisBus)
        recorder = Recorder()
        await hub.add("t1", recorder)
        ids = await client_ids(admin, bus.pubsub_client_name)
        versions.versions["t1"] = 12  # committed while the connection is gone
        await admin.client_kill_filter(_id=str(ids[0]))
        await eventually(lambda: "resync" in recorder.kinds())
        await eventually(lambda: ("invalidate", 12) in [r[1:] for r in recorder.received])
        await eventually(lambda: bus.healthy)
        await bus.publish(thread_channel("t1"), chunk_frame("t1", 0))
        await eventually(lambda: recorder.kinds()[-1] == "chunk")


async def test_add_fails_cleanly_when_the_bus_cannot_subscribe(bus: Bus, hub: Hub) -> None:
    await bus.close()
    with pytest.raises(BusClosedError):
        await within(hub.add("t1", Recorder()))
    assert hub.watched_threads == []
