"""One Bus suite for every backend (memory, Redis), plus the Redis connection-loss behaviour."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import orjson
import pytest

from realtime import connect_bus, open_bus
from realtime.bus import Bus, Subscription
from realtime.bus_errors import BusClosedError, BusUnavailableError
from realtime.channels import replay_key, scope_channel, thread_channel
from realtime.envelopes import (
    ChunkEnvelope,
    InvalidateEnvelope,
    decode_thread_message,
    encode,
)
from realtime.memory import MemoryBus
from realtime.publish_options import PublishOptions, Replay
from realtime.redis import RedisBus
from runtime.engine.control import CONTROL_CHANNEL, decode_control
from runtime.engine.publisher import Publisher
from tests.conformance.conftest_bus import (
    BACKENDS,
    TcpProxy,
    admin_redis,
    cleanup_prefix,
    client_ids,
    eventually,
    make_redis_bus,
    numsub,
    open_test_bus,
    within,
)
from tests.conformance.ill_typed import ill_typed
from tests.services import require_redis, unique_prefix


@pytest.fixture(params=BACKENDS)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    async with open_test_bus(request.param) as opened:
        yield opened


async def take(subscription: Subscription, count: int) -> list[bytes]:
    async def collect() -> list[bytes]:
        received: list[bytes] = []
        async for data in subscription:
            received.append(data)
            if len(received) == count:
                break
        return received

    return await within(collect())


async def assert_silent(subscription: Subscription, seconds: float = 0.1) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(seconds):
            await anext(aiter(subscription))


async def ended(subscription: Subscription) -> bool:
    return await within(anext(aiter(subscription), None)) is None


# -- conformance: every backend ----------------------------------------------------------------


async def test_healthy_while_open(bus: Bus) -> None:
    assert bus.healthy


async def test_messages_of_a_channel_arrive_in_publish_order(bus: Bus) -> None:
    async with bus.subscribe("thread:order") as subscription:
        sent = [f"message-{i}".encode() for i in range(200)]
        for data in sent:
            await bus.publish("thread:order", data)
        assert await take(subscription, len(sent)) == sent


async def test_every_subscriber_gets_every_message(bus: Bus) -> None:
    async with (
        bus.subscribe("thread:fan") as first,
        bus.subscribe("thread:fan") as second,
        bus.subscribe("thread:fan") as third,
    ):
        for i in range(10):
            await bus.publish("thread:fan", b"%d" % i)
        expected = [b"%d" % i for i in range(10)]
        for subscription in (first, second, third):
            assert await take(subscription, 10) == expected


async def test_many_publishes_at_once_all_arrive(bus: Bus) -> None:
    """Thousands of live runs publish at once: more operations in flight than a client pool
    holds connections must wait for one, never fail (a worker streaming 500 runs had its
    chunks refused with `Too many connections`)."""
    threads = [f"many-{n}" for n in range(300)]
    channels = [thread_channel(t) for t in threads]
    async with bus.subscribe(channels[0]) as subscription:
        replays = [Replay(replay_key(t), 10, 10_000) for t in threads]
        await within(
            asyncio.gather(
                *(
                    bus.publish(c, b"chunk", PublishOptions(replay=r))
                    for c, r in zip(channels, replays, strict=True)
                )
            )
        )
        assert await take(subscription, 1) == [b"chunk"]
    assert [await bus.read_replay(r.key) for r in replays[:3]] == [[b"chunk"]] * 3


async def test_unsubscribed_subscription_gets_nothing_more(bus: Bus) -> None:
    async with bus.subscribe("thread:u") as staying:
        async with bus.subscribe("thread:u") as leaving:
            await bus.publish("thread:u", b"both")
            assert await take(leaving, 1) == [b"both"]
        await bus.publish("thread:u", b"only-staying")
        assert await take(staying, 2) == [b"both", b"only-staying"]
        assert await ended(leaving)


async def test_close_ends_iteration(bus: Bus) -> None:
    async with bus.subscribe("thread:c") as subscription:

        async def drain() -> list[bytes]:
            return [data async for data in subscription]

        consumer = asyncio.create_task(drain())
        await bus.publish("thread:c", b"before-close")
        await asyncio.sleep(0.05)
        await bus.close()
        assert await within(consumer) == [b"before-close"]
    assert not bus.healthy
    with pytest.raises(BusClosedError):
        await bus.publish("thread:c", b"after-close")


async def test_channels_are_isolated(bus: Bus) -> None:
    async with bus.subscribe("thread:a") as a, bus.subscribe("thread:b") as b:
        await bus.publish("thread:a", b"for-a")
        await bus.publish("thread:b", b"for-b")
        assert await take(b, 1) == [b"for-b"]
        assert await take(a, 1) == [b"for-a"]
        await assert_silent(a)
        await assert_silent(b)


async def test_bytes_arrive_unchanged(bus: Bus) -> None:
    payloads = [b"", b"\x00\xff\xfe binary \r\n", "ünïcødé ✓".encode(), bytes(range(256)) * 64]
    async with bus.subscribe("thread:bytes") as subscription:
        for data in payloads:
            await bus.publish("thread:bytes", data)
        assert await take(subscription, len(payloads)) == payloads


async def test_publish_without_subscribers_is_fine(bus: Bus) -> None:
    await bus.publish("thread:nobody", b"lost")


async def test_only_bytes_are_published(bus: Bus) -> None:
    with pytest.raises(TypeError):
        await bus.publish("thread:t", ill_typed("text"))


async def test_a_subscriber_that_falls_behind_loses_its_oldest_messages() -> None:
    for kind in BACKENDS:
        async with open_test_bus(kind, max_queue=5) as bus, bus.subscribe("t:slow") as sub:
            for i in range(20):
                await bus.publish("t:slow", b"%d" % i)

            def dropped_15(sub: Subscription = sub) -> bool:
                return getattr(sub, "dropped", 0) == 15

            await eventually(dropped_15)
            assert await take(sub, 5) == [b"%d" % i for i in range(15, 20)]


async def test_replay_keeps_the_newest_entries_up_to_the_limit(bus: Bus) -> None:
    key = replay_key("r1")
    assert await bus.read_replay(key) == []
    for i in range(5):
        await bus.append_replay(key, b"chunk-%d" % i, limit=3)
    assert await bus.read_replay(key) == [b"chunk-2", b"chunk-3", b"chunk-4"]
    await bus.append_replay(key, b"chunk-5", limit=3)
    assert await bus.read_replay(key) == [b"chunk-3", b"chunk-4", b"chunk-5"]


async def test_replay_is_bounded_in_bytes_dropping_the_oldest(bus: Bus) -> None:
    key = replay_key("bytes")
    for entry in (b"aaaa", b"bbbb", b"cccc"):  # 12 bytes over a bound of 10
        await bus.append_replay(key, entry, limit=100, max_bytes=10)
    assert await bus.read_replay(key) == [b"bbbb", b"cccc"]
    await bus.append_replay(key, b"dd", limit=100, max_bytes=10)  # exactly 10: all stay
    assert await bus.read_replay(key) == [b"bbbb", b"cccc", b"dd"]
    # One entry over the bound is kept alone (it is the in-flight step's newest chunk)...
    await bus.append_replay(key, b"x" * 25, limit=100, max_bytes=10)
    assert await bus.read_replay(key) == [b"x" * 25]
    # ...and goes as soon as a newer one needs the room.
    await bus.append_replay(key, b"e", limit=100, max_bytes=10)
    assert await bus.read_replay(key) == [b"e"]
    # The count bound still holds alongside the byte bound.
    for entry in (b"1", b"2", b"3"):
        await bus.append_replay(key, entry, limit=2, max_bytes=10)
    assert await bus.read_replay(key) == [b"2", b"3"]


async def test_replay_byte_total_starts_anew_after_a_clear(bus: Bus) -> None:
    key = replay_key("cleared")
    await bus.append_replay(key, b"a" * 9, limit=100, max_bytes=10)
    await bus.clear_replay(key)
    # A total left over from before the clear would count 9 bytes too many and trim.
    await bus.append_replay(key, b"b" * 6, limit=100, max_bytes=10)
    await bus.append_replay(key, b"c" * 4, limit=100, max_bytes=10)
    assert await bus.read_replay(key) == [b"b" * 6, b"c" * 4]


async def test_concurrent_replay_appends_never_pass_the_byte_bound(bus: Bus) -> None:
    key = replay_key("racing")
    entries = [b"%03d" % n + b"." * 97 for n in range(60)]  # 100 bytes each
    await asyncio.gather(*(bus.append_replay(key, e, limit=1000, max_bytes=1000) for e in entries))
    kept = await bus.read_replay(key)
    assert len(kept) == 10 and sum(len(e) for e in kept) == 1000
    # Appending more still trims exactly: the total stayed true through the race.
    await bus.append_replay(key, b"z" * 100, limit=1000, max_bytes=1000)
    kept_after = await bus.read_replay(key)
    assert kept_after[-1] == b"z" * 100 and kept_after[:-1] == kept[1:]


async def test_replay_clear_and_isolation(bus: Bus) -> None:
    await bus.append_replay(replay_key("x"), b"x0", limit=10)
    await bus.append_replay(replay_key("y"), b"y0", limit=10)
    await bus.clear_replay(replay_key("x"))
    assert await bus.read_replay(replay_key("x")) == []
    assert await bus.read_replay(replay_key("y")) == [b"y0"]
    await bus.clear_replay(replay_key("never-written"))


def kept(
    key: str,
    limit: int,
    max_bytes: int | None = None,
    then: list[tuple[str, bytes]] | None = None,
    clear: bool = False,
) -> PublishOptions:
    """Publish options that keep the messages in replay buffer `key`."""
    return PublishOptions(replay=Replay(key, limit, max_bytes), then=then or (), clear_replay=clear)


async def test_publish_with_replay_appends_then_publishes(bus: Bus) -> None:
    key = replay_key("pr")
    async with bus.subscribe(thread_channel("pr")) as subscription:
        for i in range(4):
            await bus.publish(thread_channel("pr"), b"c%d" % i, kept(key, 3))
            # By the time a subscriber has the message, the replay buffer holds it.
            assert await take(subscription, 1) == [b"c%d" % i]
            assert (await bus.read_replay(key))[-1] == b"c%d" % i
    assert await bus.read_replay(key) == [b"c1", b"c2", b"c3"]
    with pytest.raises(ValueError):
        await bus.publish(thread_channel("pr"), b"x", kept(key, 0))
    with pytest.raises(TypeError):
        await bus.publish(thread_channel("pr"), ill_typed("text"), kept(key, 3))
    with pytest.raises(ValueError):  # nothing to clear without a buffer
        await bus.publish(thread_channel("pr"), b"x", PublishOptions(clear_replay=True))
    assert await bus.read_replay(key) == [b"c1", b"c2", b"c3"]


async def test_plain_publish_of_several_messages_publishes_them_in_order(bus: Bus) -> None:
    """Without a replay buffer: the messages, then `then`, and no buffer is touched."""
    key, channel, other = replay_key("pl"), thread_channel("pl"), scope_channel("pl-scope")
    await bus.append_replay(key, b"old", limit=5)
    async with bus.subscribe(channel) as live, bus.subscribe(other) as scope:
        await bus.publish(channel, [b"a", b"b"], PublishOptions(then=[(other, b"s")]))
        await bus.publish(channel, [b"c"])
        await bus.publish(channel, [])
        assert await take(live, 3) == [b"a", b"b", b"c"]
        assert await take(scope, 1) == [b"s"]
        with pytest.raises(TypeError):
            await bus.publish(channel, [b"x", ill_typed("text")])
        await assert_silent(live)
    assert await bus.read_replay(key) == [b"old"]


async def test_a_batch_with_replay_is_one_message_at_a_time(bus: Bus) -> None:
    """A batch leaves what one publish per entry would: every entry published in order, the
    buffer trimmed by count and by bytes after each append, the newest kept."""
    key, channel = replay_key("prm"), thread_channel("prm")
    # The same entries one by one, on another thread (a cluster keeps a thread on one slot).
    key_one, channel_one = replay_key("prm1"), thread_channel("prm1")
    entries = [b"a" * 4, b"b" * 4, b"c" * 9, b"d" * 2, b"e" * 3]
    async with bus.subscribe(channel) as subscription, bus.subscribe(channel_one) as one:
        await bus.publish(channel, entries[:2], kept(key, 3, 10))
        await bus.publish(channel, entries[2:], kept(key, 3, 10))
        await bus.publish(channel, [], kept(key, 3, 10))
        assert await take(subscription, 5) == entries
        for entry in entries:
            await bus.publish(channel_one, entry, kept(key_one, 3, 10))
        assert await take(one, 5) == entries
    assert await bus.read_replay(key) == await bus.read_replay(key_one) == [b"d" * 2, b"e" * 3]
    await bus.publish(channel, [b"f", b"g"], kept(key, 3))
    assert await bus.read_replay(key) == [b"e" * 3, b"f", b"g"]
    with pytest.raises(ValueError):
        await bus.publish(channel, [b"x"], kept(key, 0))
    with pytest.raises(TypeError):
        await bus.publish(channel, [b"x", ill_typed("text")], kept(key, 3))
    assert await bus.read_replay(key) == [b"e" * 3, b"f", b"g"]


async def test_a_batch_then_publishes_after_the_entries_and_clears(bus: Bus) -> None:
    """`then` and `clear_replay`: the entries, then the `then` messages in order, then the
    clear, as the separate calls would leave it; nothing is published when a message is not
    bytes."""
    key, channel = replay_key("prt"), thread_channel("prt")
    other = scope_channel("prt-scope")
    await bus.append_replay(key, b"old", limit=5)
    async with bus.subscribe(channel) as live, bus.subscribe(other) as scope:
        then = [(channel, b"inv-1"), (other, b"scope-1"), (channel, b"inv-2")]
        await bus.publish(channel, [b"c1", b"c2"], kept(key, 5, then=then, clear=True))
        assert await take(live, 4) == [b"c1", b"c2", b"inv-1", b"inv-2"]
        assert await take(scope, 1) == [b"scope-1"]
        assert await bus.read_replay(key) == []
        # A buffer cleared this way counts its bytes anew (the byte bound still holds).
        await bus.publish(channel, [b"d" * 4, b"e" * 4], kept(key, 5, 8))
        assert await bus.read_replay(key) == [b"d" * 4, b"e" * 4]
        # `then` without the clear: the entries stay in the buffer, trimmed as usual.
        await bus.publish(channel, [b"f"], kept(key, 2, then=[(channel, b"inv-3")]))
        assert await take(live, 4) == [b"d" * 4, b"e" * 4, b"f", b"inv-3"]
        assert await bus.read_replay(key) == [b"e" * 4, b"f"]
        # No entries: what `publish_all(then, key)` does.
        await bus.publish(channel, [], kept(key, 2, then=[(other, b"s")], clear=True))
        assert await take(scope, 1) == [b"s"]
        assert await bus.read_replay(key) == []
        await bus.append_replay(key, b"kept", limit=5)
        with pytest.raises(TypeError):
            bad: list[tuple[str, bytes]] = [(channel, ill_typed("text"))]
            await bus.publish(channel, [b"x"], kept(key, 5, then=bad, clear=True))
        with pytest.raises(ValueError):
            await bus.publish(channel, [], kept(key, 0, then=[(channel, b"y")]))
        await assert_silent(live)
        await assert_silent(scope)
    assert await bus.read_replay(key) == [b"kept"]


async def test_publish_all_publishes_in_order_then_clears(bus: Bus) -> None:
    key = replay_key("pa")
    await bus.append_replay(key, b"old", limit=5)
    async with bus.subscribe("a") as first, bus.subscribe("b") as second:
        await bus.publish_all([("a", b"1"), ("b", b"2"), ("a", b"3")], key)
        assert await take(first, 2) == [b"1", b"3"]
        assert await take(second, 1) == [b"2"]
        assert await bus.read_replay(key) == []
        await bus.append_replay(key, b"kept", limit=5)
        await bus.publish_all([("a", b"4")])  # no key: nothing cleared
        assert await take(first, 1) == [b"4"]
    assert await bus.read_replay(key) == [b"kept"]
    with pytest.raises(TypeError):
        await bus.publish_all([("a", b"ok"), ("a", ill_typed("text"))])


async def test_publisher_committed_invalidates_and_clears_the_replay(bus: Bus) -> None:
    async def scope_of(thread_id: str) -> str:
        return "acme"

    publisher = Publisher(bus, scope_of=scope_of)
    assert await publisher.chunk("t9", "r", 0, {"type": "text-delta", "delta": "x"})
    async with (
        bus.subscribe(thread_channel("t9")) as live,
        bus.subscribe(scope_channel("acme")) as scope,
    ):
        assert await publisher.committed("t9", 4)
        assert decode_thread_message((await take(live, 1))[0]) == InvalidateEnvelope(
            thread_id="t9", version=4
        )
        assert orjson.loads((await take(scope, 1))[0]) == {
            "type": "scope.invalidate",
            "scope": "acme",
            "thread_id": "t9",
            "version": 4,
        }
    assert await bus.read_replay(replay_key("t9")) == []


async def test_publisher_committed_publishes_the_held_chunks_first(bus: Bus) -> None:
    """A commit's chunks not yet published, then its invalidation (and the scope's), then
    the replay cleared: on the thread's channel exactly what `chunks` then `committed` show."""

    async def scope_of(thread_id: str) -> str:
        return "acme"

    publisher = Publisher(bus, scope_of=scope_of)
    delta = {"type": "text-delta", "delta": "x"}
    data = [publisher.chunk_data("t8", "r", seq, delta) for seq in range(3)]
    async with (
        bus.subscribe(thread_channel("t8")) as live,
        bus.subscribe(scope_channel("acme")) as scope,
    ):
        assert await publisher.chunks("t8", data[:1])
        assert await publisher.committed("t8", 6, data[1:])
        frames = await take(live, 4)
        assert frames[:3] == data
        assert decode_thread_message(frames[3]) == InvalidateEnvelope(thread_id="t8", version=6)
        assert orjson.loads((await take(scope, 1))[0])["version"] == 6
        await assert_silent(live)
    assert await bus.read_replay(replay_key("t8")) == []
    await bus.close()
    assert not await publisher.committed("t8", 7, data)


async def test_replay_rejects_a_non_positive_limit(bus: Bus) -> None:
    with pytest.raises(ValueError):
        await bus.append_replay(replay_key("bad"), b"x", limit=0)
    with pytest.raises(ValueError):
        await bus.append_replay(replay_key("bad"), b"x", limit=5, max_bytes=0)
    assert await bus.read_replay(replay_key("bad")) == []


async def test_publisher_bounds_the_replay_in_bytes(bus: Bus) -> None:
    first = encode(ChunkEnvelope(thread_id="t2", run_id="r", seq=0, chunk={"delta": "x"}))
    publisher = Publisher(bus, replay_max_bytes=3 * len(first))
    for seq in range(5):
        assert await publisher.chunk("t2", "r", seq, {"delta": "x"})
    kept = await bus.read_replay(replay_key("t2"))
    envelopes = [decode_thread_message(k) for k in kept]
    assert [e.seq if isinstance(e, ChunkEnvelope) else e for e in envelopes] == [2, 3, 4]


async def test_publisher_chunks_go_live_and_into_replay(bus: Bus) -> None:
    publisher = Publisher(bus, replay_limit=2)
    async with bus.subscribe(thread_channel("t1")) as subscription:
        for seq in range(3):
            assert await publisher.chunk("t1", "run-1", seq, {"type": "text-delta", "delta": "x"})
        assert await publisher.invalidate("t1", 7)
        frames = await take(subscription, 4)
    assert [decode_thread_message(f).type for f in frames] == ["chunk"] * 3 + ["invalidate"]
    assert await bus.read_replay(replay_key("t1")) == frames[1:3]
    delta = {"type": "text-delta", "delta": "x"}
    assert frames[2] == encode(ChunkEnvelope(thread_id="t1", run_id="run-1", seq=2, chunk=delta))
    assert await publisher.clear_replay("t1")
    assert await bus.read_replay(replay_key("t1")) == []


async def test_publisher_control_signals(bus: Bus) -> None:
    publisher = Publisher(bus)
    async with bus.subscribe(CONTROL_CHANNEL) as control:
        assert await publisher.wakeup()
        assert await publisher.wakeup("run-9")
        assert await publisher.stop("run-9")
        messages = [decode_control(data) for data in await take(control, 3)]
    assert [(m.type, m.run_id) for m in messages] == [
        ("wakeup", None),
        ("wakeup", "run-9"),
        ("stop", "run-9"),
    ]


async def test_publisher_invalidate_with_signals(bus: Bus) -> None:
    """The invalidation, its scope's announcement, then the stop and the wakeup, in order."""

    async def scope_of(thread_id: str) -> str:
        return "acme"

    publisher = Publisher(bus, scope_of=scope_of)
    async with (
        bus.subscribe(thread_channel("t5")) as live,
        bus.subscribe(scope_channel("acme")) as scope,
        bus.subscribe(CONTROL_CHANNEL) as control,
    ):
        assert await publisher.invalidate("t5", 3, stop="run-1", wakeup="run-2")
        assert await publisher.invalidate("t5", 4, wakeup="run-3")
        assert [decode_thread_message(f) for f in await take(live, 2)] == [
            InvalidateEnvelope(thread_id="t5", version=3),
            InvalidateEnvelope(thread_id="t5", version=4),
        ]
        assert [orjson.loads(f)["version"] for f in await take(scope, 2)] == [3, 4]
        signals = [decode_control(data) for data in await take(control, 3)]
    assert [(m.type, m.run_id) for m in signals] == [
        ("stop", "run-1"),
        ("wakeup", "run-2"),
        ("wakeup", "run-3"),
    ]


async def test_publisher_never_raises_bus_failures(bus: Bus) -> None:
    publisher = Publisher(bus)
    await bus.close()
    assert not await publisher.chunk("t", "r", 0, {"type": "text-delta", "delta": "x"})
    assert not await publisher.invalidate("t", 1)
    assert not await publisher.invalidate("t", 1, stop="r", wakeup="r")
    assert not await publisher.chunks("t", [b"x"])
    assert not await publisher.clear_replay("t")
    assert not await publisher.wakeup()
    assert not await publisher.stop("r")


# -- the in-process bus -------------------------------------------------------------------------


async def test_memory_bus_delivers_the_published_object_itself() -> None:
    async with MemoryBus() as bus, bus.subscribe("c") as one, bus.subscribe("c") as two:
        data = b"shared"
        await bus.publish("c", data)
        assert (await take(one, 1))[0] is data
        assert (await take(two, 1))[0] is data


async def test_memory_replay_expires() -> None:
    now = [0.0]
    async with MemoryBus(replay_ttl=10, clock=lambda: now[0]) as bus:
        await bus.append_replay("k", b"a", limit=5)
        now[0] = 9.0
        assert await bus.read_replay("k") == [b"a"]
        await bus.append_replay("k", b"b", limit=5)  # refreshes the expiry
        now[0] = 18.0
        assert await bus.read_replay("k") == [b"a", b"b"]
        now[0] = 20.0
        assert await bus.read_replay("k") == []


async def test_memory_bus_must_be_opened_and_cannot_reopen() -> None:
    bus = MemoryBus()
    with pytest.raises(BusClosedError):
        await bus.publish("c", b"x")
    await bus.open()
    await bus.close()
    with pytest.raises(BusClosedError):
        await bus.open()


def test_open_bus_picks_the_backend_by_url() -> None:
    assert isinstance(open_bus(None), MemoryBus)
    redis_bus = open_bus("redis://127.0.0.1:6379/0", prefix="p:")
    assert isinstance(redis_bus, RedisBus)
    assert redis_bus.prefix == "p:"
    with pytest.raises(ValueError):
        open_bus("amqp://elsewhere")


# -- Redis: reference counting, connection loss, shutdown ---------------------------------------


@pytest.fixture
async def redis_bus() -> AsyncIterator[RedisBus]:
    require_redis()
    bus = make_redis_bus()
    try:
        async with bus:
            yield bus
    finally:
        await cleanup_prefix(bus.prefix)


async def test_redis_publish_reloads_its_scripts(redis_bus: RedisBus) -> None:
    """A Redis that lost its scripts (restarted, SCRIPT FLUSH) still gets every chunk."""
    key = replay_key("flushed")
    async with redis_bus.subscribe(thread_channel("flushed")) as subscription:
        await redis_bus.publish(thread_channel("flushed"), b"a", kept(key, 5))
        async with admin_redis() as admin:
            await admin.script_flush()
        await redis_bus.publish(thread_channel("flushed"), b"b", kept(key, 5))
        assert await take(subscription, 2) == [b"a", b"b"]
        async with admin_redis() as admin:
            await admin.script_flush()
        await redis_bus.publish_all([(thread_channel("flushed"), b"c")])
        assert await take(subscription, 1) == [b"c"]
        async with admin_redis() as admin:
            await admin.script_flush()
        await redis_bus.publish(thread_channel("flushed"), [b"d", b"e"], kept(key, 5))
        assert await take(subscription, 2) == [b"d", b"e"]
    assert await redis_bus.read_replay(key) == [b"a", b"b", b"d", b"e"]


async def test_redis_script_calls_survive_a_killed_idle_connection(redis_bus: RedisBus) -> None:
    """A pooled command connection that died while idle (Redis restarted, killed it) costs a
    script call one retry on a new connection, as redis-py's own commands retry."""
    key, channel = replay_key("killed"), thread_channel("killed")
    async with redis_bus.subscribe(channel) as subscription, admin_redis() as admin:
        await redis_bus.publish(channel, [b"a"], kept(key, 5))
        ids = await client_ids(admin, redis_bus.command_client_name)
        assert ids
        for client_id in ids:
            await admin.client_kill_filter(_id=str(client_id))
        await redis_bus.publish(channel, [b"b"], kept(key, 5, then=[(channel, b"inv")], clear=True))
        assert await take(subscription, 3) == [b"a", b"b", b"inv"]
        assert set(await client_ids(admin, redis_bus.command_client_name)).isdisjoint(ids)
    assert await redis_bus.read_replay(key) == []


def test_redis_scripts_are_packed_as_redis_py_packs_them() -> None:
    from redis.asyncio.connection import Connection

    from realtime.redis import pack_command

    args = ("EVALSHA", "ab12", 2, "k:{é}", "k:{é}:bytes", 0, 1048576, b"\x00\r\n", b"", "")
    assert pack_command(*args) == b"".join(Connection().pack_command(*args))
    with pytest.raises(TypeError):
        pack_command("PUBLISH", "c", ill_typed(1.5))


async def test_redis_subscribes_a_channel_once_per_process(redis_bus: RedisBus) -> None:
    channel = redis_bus.prefix + "thread:rc"
    async with admin_redis() as admin:
        assert len(await client_ids(admin, redis_bus.pubsub_client_name)) == 1
        async with redis_bus.subscribe("thread:rc"), redis_bus.subscribe("thread:rc"):
            async with redis_bus.subscribe("thread:rc"):
                assert await numsub(admin, channel) == 1
            assert await numsub(admin, channel) == 1
            assert redis_bus.subscriber_count("thread:rc") == 2
        await eventually(lambda: redis_bus.subscriber_count("thread:rc") == 0)
        for _ in range(200):  # UNSUBSCRIBE is sent without waiting for its reply
            if await numsub(admin, channel) == 0:
                break
            await asyncio.sleep(0.01)
        assert await numsub(admin, channel) == 0
        assert len(await client_ids(admin, redis_bus.pubsub_client_name)) == 1


async def test_redis_recovers_from_a_killed_pubsub_connection() -> None:
    require_redis()
    # A wider backoff keeps the unhealthy window long enough to observe it.
    bus = make_redis_bus(min_backoff=0.3, max_backoff=0.3)
    reconnects: list[bool] = []
    health: list[bool] = []

    async def on_reconnect() -> None:
        reconnects.append(bus.healthy)

    try:
        async with bus, admin_redis() as admin, bus.subscribe("thread:k") as subscription:
            bus.add_reconnect_listener(on_reconnect)
            await bus.publish("thread:k", b"before")
            assert await take(subscription, 1) == [b"before"]

            ids = await client_ids(admin, bus.pubsub_client_name)
            assert len(ids) == 1
            await admin.client_kill_filter(_id=str(ids[0]))

            async def watch_health() -> None:
                while not (False in health and health[-1]):
                    if not health or health[-1] != bus.healthy:
                        health.append(bus.healthy)
                    await asyncio.sleep(0.005)

            await within(watch_health())
            assert health[-2:] == [False, True]
            assert reconnects == [True]
            new_ids = await client_ids(admin, bus.pubsub_client_name)
            assert len(new_ids) == 1 and new_ids != ids
            await bus.publish("thread:k", b"after")
            assert await take(subscription, 1) == [b"after"]
    finally:
        await cleanup_prefix(bus.prefix)


async def test_redis_outage_publish_fails_clearly_and_subscriptions_resume() -> None:
    require_redis()
    proxy = TcpProxy()
    await proxy.start()
    bus = make_redis_bus(proxy.url)
    reconnected = asyncio.Event()
    bus.add_reconnect_listener(reconnected.set)
    try:
        async with bus, bus.subscribe("thread:old") as old:
            await proxy.stop()
            await eventually(lambda: not bus.healthy)
            with pytest.raises(BusUnavailableError, match="thread:old"):
                await within(bus.publish("thread:old", b"lost"))
            with pytest.raises(BusUnavailableError):
                await within(bus.append_replay("k", b"x", limit=5))
            # Subscribing while Redis is down works; Redis learns about it on reconnect.
            async with bus.subscribe("thread:new") as new:
                await proxy.start()
                await within(reconnected.wait())
                assert bus.healthy
                await bus.publish("thread:old", b"old-again")
                await bus.publish("thread:new", b"new")
                assert await take(old, 1) == [b"old-again"]
                assert await take(new, 1) == [b"new"]
    finally:
        await proxy.stop()
        await cleanup_prefix(bus.prefix)


async def test_redis_detects_a_silent_connection_with_ping() -> None:
    require_redis()
    proxy = TcpProxy()
    await proxy.start()
    # Nothing is closed here, so only the PING probe and the reconnect deadline can notice.
    bus = make_redis_bus(proxy.url, ping_interval=0.1, connect_timeout=0.3, subscribe_timeout=0.3)
    reconnected = asyncio.Event()
    bus.add_reconnect_listener(reconnected.set)
    try:
        async with bus, bus.subscribe("thread:s") as subscription:
            proxy.freeze()
            await eventually(lambda: not bus.healthy)
            await asyncio.sleep(0.5)  # reconnect attempts hang too and must time out
            assert not bus.healthy
            proxy.thaw()
            await within(reconnected.wait())
            await bus.publish("thread:s", b"after-thaw")
            assert await take(subscription, 1) == [b"after-thaw"]
    finally:
        proxy.thaw()
        await proxy.stop()
        await cleanup_prefix(bus.prefix)


async def test_redis_open_fails_clearly_when_unreachable() -> None:
    proxy = TcpProxy()
    await proxy.start()
    url = proxy.url
    await proxy.stop()
    bus = make_redis_bus(url)
    with pytest.raises(BusUnavailableError, match="cannot reach Redis"):
        await within(bus.open())
    assert not bus.healthy
    with pytest.raises(BusClosedError):
        await bus.publish("thread:x", b"x")
    await bus.close()


async def test_redis_close_stops_the_reader_and_releases_connections() -> None:
    require_redis()
    bus = make_redis_bus()
    async with admin_redis() as admin:
        await bus.open()
        reader = bus._reader  # the one private peek: close() must have awaited this task
        assert reader is not None
        async with bus.subscribe("thread:z") as subscription:
            await bus.publish("thread:z", b"x")
            assert await take(subscription, 1) == [b"x"]
            await within(bus.close())
            assert reader.done()
            assert await ended(subscription)
        for name in (bus.pubsub_client_name, bus.command_client_name):
            for _ in range(200):
                if not await client_ids(admin, name):
                    break
                await asyncio.sleep(0.01)
            assert await client_ids(admin, name) == []
    await within(bus.close())  # idempotent


async def test_connect_bus_waits_for_a_redis_that_comes_up_late() -> None:
    """A process started while Redis is still down waits for it instead of exiting."""
    require_redis()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = TcpProxy()
    proxy.port = port
    bus = RedisBus(proxy.url, prefix=unique_prefix(), connect_timeout=0.5)
    opening = asyncio.create_task(connect_bus(bus, timeout=20))
    await asyncio.sleep(0.8)
    assert not opening.done()  # nothing listens yet: still retrying
    await proxy.start()
    try:
        await asyncio.wait_for(opening, 15)
        assert bus.healthy
    finally:
        await bus.close()
        await proxy.stop()


async def test_connect_bus_gives_up_after_its_deadline() -> None:
    bus = RedisBus("redis://127.0.0.1:9/0", prefix=unique_prefix(), connect_timeout=0.2)
    with pytest.raises(BusUnavailableError):
        await asyncio.wait_for(connect_bus(bus, timeout=0.5), 10)
