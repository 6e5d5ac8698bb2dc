"""Many live runs publishing at once through one bus: each thread's order and replay hold however
the backend coalesces the publishes of different runs (RedisBus: one pipeline per batch), and a
failure reaches the publishes it concerns only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import orjson
import pytest

from realtime.bus import Bus, Subscription
from realtime.channels import replay_key, thread_channel
from realtime.envelopes import ChunkEnvelope, InvalidateEnvelope, decode_thread_message
from realtime.redis import RedisBus
from runtime.engine.publisher import Publisher
from tests.conformance.conftest_bus import (
    BACKENDS,
    TcpProxy,
    admin_redis,
    cleanup_prefix,
    make_redis_bus,
    open_test_bus,
    within,
)
from tests.services import require_redis

RUNS = 120
CHUNKS = 12
WATCHED = range(0, RUNS, 10)  # every tenth thread has a subscriber


@pytest.fixture(params=BACKENDS)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    async with open_test_bus(request.param) as opened:
        yield opened


async def collect(subscription: Subscription, count: int) -> list[bytes]:
    received: list[bytes] = []
    async for data in subscription:
        received.append(data)
        if len(received) == count:
            break
    return received


async def stream(publisher: Publisher, n: int, commit: bool) -> None:
    """One run: its chunks one at a time, each after the last was accepted (as `ChunkSink`
    publishes), yielding between them so the runs interleave; with `commit`, the last two go
    with the commit's invalidation (`Publisher.committed`)."""
    thread = f"live-{n}"
    data = [
        publisher.chunk_data(thread, f"run-{n}", seq, {"type": "text-delta", "delta": f"{seq}"})
        for seq in range(CHUNKS)
    ]
    live = data[:-2] if commit else data
    for item in live:
        assert await publisher.chunks(thread, [item])
        await asyncio.sleep(0)
    if commit:
        assert await publisher.committed(thread, 1, data[-2:])


async def test_concurrent_runs_keep_each_threads_order_and_replay(bus: Bus) -> None:
    """Breaks with: a caller answered before its command ran (`CommandPipe.send` returning
    without awaiting its reply: a run's next chunk may then overtake it)."""
    publisher = Publisher(bus)
    watched = {n: thread_channel(f"live-{n}") for n in WATCHED}
    async with AsyncExitStack() as stack:
        subscriptions = [
            await stack.enter_async_context(bus.subscribe(c)) for c in watched.values()
        ]
        readers = [
            asyncio.create_task(collect(subscriptions[i], CHUNKS + (1 if n % 20 == 0 else 0)))
            for i, n in enumerate(watched)
        ]
        # Even threads commit at the end, odd ones leave their chunks in the replay buffer.
        await within(asyncio.gather(*(stream(publisher, n, n % 20 == 0) for n in range(RUNS))))
        got = await within(asyncio.gather(*readers))
    for n, messages in zip(watched, got, strict=True):
        decoded = [decode_thread_message(m) for m in messages]
        chunks = [m for m in decoded if isinstance(m, ChunkEnvelope)]
        assert [c.seq for c in chunks] == list(range(CHUNKS)), n
        assert all(c.thread_id == f"live-{n}" for c in chunks)
        if n % 20 == 0:
            assert isinstance(decoded[-1], InvalidateEnvelope) and decoded[-1].version == 1
    for n in range(RUNS):
        replay = await bus.read_replay(replay_key(f"live-{n}"))
        if n % 20 == 0:
            assert replay == [], n  # the commit cleared it
        else:
            seqs = [orjson.loads(entry)["seq"] for entry in replay]
            assert seqs == list(range(CHUNKS)), n


async def test_a_failing_publish_fails_alone(bus: Bus) -> None:
    """A publish Redis refuses (its replay key holds a string: WRONGTYPE) fails; the others
    sent with it in the same batch succeed. Breaks with: an error reply failing the whole
    batch (`CommandPipe._exchange` raising it instead of answering its caller)."""
    if not isinstance(bus, RedisBus):
        pytest.skip("an error reply needs Redis")
    async with admin_redis() as admin:
        await admin.set(bus.prefix + replay_key("broken"), "not a list")
    publisher = Publisher(bus)
    threads = ["broken", *(f"fine-{n}" for n in range(50))]
    results = await within(
        asyncio.gather(
            *(
                publisher.chunks(t, [publisher.chunk_data(t, "r", 0, {"type": "text-delta"})])
                for t in threads
            )
        )
    )
    assert results == [False] + [True] * 50
    assert await bus.read_replay(replay_key("fine-7")) != []


async def test_redis_coalesces_the_publishes_of_concurrent_runs() -> None:
    """500 runs publishing at once cost a few writes, not 500. Breaks with: the pipe taking
    one command per batch (`max_batch=1`)."""
    require_redis()
    bus = make_redis_bus()
    try:
        async with bus:
            publisher = Publisher(bus)
            await publisher.chunks("warm", [b"x"])  # the script is loaded
            pipe = bus._pipe
            assert pipe is not None
            batches, commands = pipe.batches, pipe.commands
            results = await within(
                asyncio.gather(*(publisher.chunks(f"c-{n}", [b"chunk"]) for n in range(500)))
            )
            assert all(results)
            assert pipe.commands - commands == 500
            assert pipe.batches - batches <= 20
    finally:
        await cleanup_prefix(bus.prefix)


async def test_redis_publishes_of_a_silent_redis_fail_by_their_deadline() -> None:
    """Redis stops answering: every queued publish fails within its deadline (queueing
    included), the publisher returns False, and once Redis answers again publishing works.
    Breaks with: no deadline on a batch (`asyncio.timeout_at` removed from `_exchange`)."""
    require_redis()
    proxy = TcpProxy()
    await proxy.start()
    bus = make_redis_bus(proxy.url, command_timeout=0.5, ping_interval=60)
    try:
        async with bus:
            publisher = Publisher(bus)
            assert await publisher.chunks("s", [b"before"])
            proxy.freeze()
            loop = asyncio.get_running_loop()
            began = loop.time()
            results = await within(
                asyncio.gather(*(publisher.chunks(f"s-{n}", [b"x"]) for n in range(200)))
            )
            assert results == [False] * 200
            assert loop.time() - began < 2.0  # 0.5 s each, not one timeout after another
            proxy.thaw()
            await proxy.stop()  # the frozen connections are gone: the retry takes a new one
            await proxy.start()
            assert await within(publisher.chunks("s", [b"after"]))
    finally:
        await proxy.stop()
        await cleanup_prefix(bus.prefix)
