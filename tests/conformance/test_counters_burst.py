"""Quota counters under a burst: thousands of concurrent calls, all counted in Redis, over a
few connections (the pool refused the 101st before, and those calls fell back unshared)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis

from realtime.counters import RedisCounters
from realtime.redis_urls import command_client
from tests.services import require_redis, require_redis_cluster

pytestmark = pytest.mark.redis

CALLS = 3000
CAP = 2000  # of the CALLS, exactly this many are admitted: the cap is shared, not per gateway
SENDERS = 2


@asynccontextmanager
async def two_gateways(url: str) -> AsyncIterator[tuple[list[RedisCounters], str]]:
    """Two gateways' counters on one Redis and one key prefix of this test's own (its keys are
    deleted after); yields them and their client name."""
    run = uuid.uuid4().hex[:8]
    prefix, name = f"test-burst-{run}:", f"test-burst-{run}"
    # A batch's timeout well above the default's 0.5 s: this counts calls, and a box busy with
    # other work must not turn a slow batch into fallbacks (timeouts have tests of their own).
    gateways = [
        RedisCounters(url, prefix, client_name=name, senders=SENDERS, timeout=5.0) for _ in range(2)
    ]
    try:
        yield gateways, name
    finally:
        for gateway in gateways:
            await gateway.close()
        # The sets empty themselves when every member leaves; a failed test leaves them to
        # expire (60 s), but the bucket would outlive it. One hash tag: one call on a cluster.
        admin = command_client(url)
        try:
            await admin.delete(prefix + "rate:token:t")
            tokens = [f"{prefix}ws:token:{{s}}:{i}" for i in range(CALLS)]
            await admin.delete(f"{prefix}ws:subject:{{s}}", *tokens)
        finally:
            await admin.aclose()


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
async def test_a_burst_of_concurrent_calls_is_counted_exactly_across_two_gateways(
    backend: str,
) -> None:
    url = require_redis() if backend == "redis" else require_redis_cluster()
    async with asyncio.timeout(60), two_gateways(url) as (gateways, name):
        slots = [
            ((f"ws:token:{{s}}:{i}", "ws:subject:{s}"), uuid.uuid4().hex, gateways[i % 2])
            for i in range(CALLS)
        ]
        # Connect: every websocket at once, half on each gateway; the subject's cap is shared.
        joined = await asyncio.gather(
            *(g.join(keys, (1, CAP), member, ttl=60) for keys, member, g in slots)
        )
        assert joined.count(-1) == CAP and joined.count(1) == CALLS - CAP
        # Commands: one bucket of CAP tokens (refilled once in 1000 s), drawn by every caller.
        waits = await asyncio.gather(
            *(g.take("rate:token:t", rate=0.001, burst=CAP) for _, _, g in slots)
        )
        assert waits.count(0.0) == CAP and all(w > 0 for w in waits if w != 0.0)
        # Close: every websocket at once; afterwards the subject's set is empty in Redis, and a
        # new connection fits although the gateways' own (fallback) sets never saw these leave.
        await asyncio.gather(*(g.leave(keys, member) for keys, member, g in slots))
        assert await gateways[0].join(("ws:subject:{s}",), (1,), "after", ttl=60) == -1
        await gateways[0].leave(("ws:subject:{s}",), "after")

        for gateway in gateways:
            assert gateway.fallbacks == 0 and gateway.shared
            assert gateway.batcher.peak_senders <= SENDERS
            # Batches, not calls: 3 bursts of 1500 calls per gateway in batches of at most 512.
            assert gateway.batcher.calls >= 3 * CALLS // 2
            assert gateway.batcher.batches < gateway.batcher.calls / 50
        if backend == "redis":
            admin = Redis.from_url(url)
            try:
                clients = [c for c in await admin.client_list() if c.get("name") == name]
            finally:
                await admin.aclose()
            # The pool refused the 101st concurrent call before; now each gateway holds at most
            # one connection per batch in flight.
            assert 1 <= len(clients) <= 2 * SENDERS, clients


async def test_a_burst_against_a_redis_that_is_down_is_counted_by_the_process() -> None:
    # Nothing listens on port 1: every batch fails fast, every call is counted locally, exactly.
    down = RedisCounters("redis://127.0.0.1:1/0", "down:", timeout=0.2)
    try:
        async with asyncio.timeout(30):
            waits = await asyncio.gather(
                *(down.take("b", rate=0.001, burst=100) for _ in range(500))
            )
        assert waits.count(0.0) == 100
        assert down.fallbacks == 500 and not down.shared
    finally:
        await down.close()


async def test_a_script_that_redis_does_not_know_is_loaded_and_the_batch_sent_again() -> None:
    url = require_redis()
    counters = RedisCounters(url, f"test-burst-{uuid.uuid4().hex[:8]}:")
    try:
        # A body no Redis has seen, and the batcher told it was loaded: the first batch gets
        # NOSCRIPT, as after a Redis restart or SCRIPT FLUSH.
        batcher = counters.batcher
        echo = batcher.operation(f"-- {uuid.uuid4().hex}\nreturn ARGV[1]")
        await batcher.call(echo, [], ["warm"])  # connects and loads: the slot map, the script
        batcher.operation(f"-- {uuid.uuid4().hex}\nreturn 0")  # a new script, "loaded"
        batcher._loaded = True
        replies = await asyncio.gather(*(batcher.call(echo, [], [str(i)]) for i in range(10)))
        assert replies == [str(i).encode() for i in range(10)]
    finally:
        await counters.close()


async def test_callers_cancelled_while_queued_do_not_disturb_the_others() -> None:
    url = require_redis()
    counters = RedisCounters(url, f"test-burst-{uuid.uuid4().hex[:8]}:")
    try:
        batcher = counters.batcher
        echo = batcher.operation("return ARGV[1]")
        calls = [asyncio.ensure_future(batcher.call(echo, [], [str(i)])) for i in range(50)]
        await asyncio.sleep(0)  # every call queued, none sent yet
        for call in calls[::2]:
            call.cancel()
        done = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(d, asyncio.CancelledError) for d in done[::2])
        assert done[1::2] == [str(i).encode() for i in range(1, 50, 2)]
        assert batcher.calls == 25  # the cancelled ones were never sent
    finally:
        await counters.close()
