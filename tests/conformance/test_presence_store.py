"""The Redis presence store on one Redis and on a Redis Cluster: values, beats, bursts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from realtime.presence_store import MAX_IN_FLIGHT, RedisPresence
from tests.conformance.conftest_bus import cleanup_prefix, within
from tests.services import require_redis, require_redis_cluster

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", "redis-cluster"])
async def presence(request: pytest.FixtureRequest) -> AsyncIterator[RedisPresence]:
    cluster = request.param == "redis-cluster"
    url = require_redis_cluster() if cluster else require_redis()
    store = RedisPresence(url, prefix=f"threadline-test-{uuid.uuid4().hex[:10]}:")
    await store.open()
    try:
        yield store
    finally:
        await store.close()
        await cleanup_prefix(store.prefix, cluster=cluster)


async def test_values_of_many_threads_are_written_read_and_removed(
    presence: RedisPresence,
) -> None:
    threads = [f"th-presence-{i}" for i in range(12)]  # one pipeline across slots
    assert await presence.beat("gw1", 30) is False  # its first beat
    await presence.write_many([(t, "gw1", b'{"m1":{}}') for t in threads])
    together = await presence.read_many(threads)
    assert together == {t: {"gw1": b'{"m1":{}}'} for t in threads}
    await presence.write_many([(threads[0], "gw1", None)])
    left = await presence.read_many(threads[:2])
    assert left == {threads[0]: {}, threads[1]: {"gw1": b'{"m1":{}}'}}
    assert await presence.read_many([]) == {}


async def test_a_gateways_values_count_only_while_its_beat_lasts(presence: RedisPresence) -> None:
    threads = [f"th-many-{i}" for i in range(40)]  # spread over a cluster's slots
    assert not await presence.beat("gw1", 30)
    assert not await presence.beat("gw2", 0.3)
    assert await presence.beat("gw1", 30)  # it was alive until now
    await presence.write_many(
        [(t, "gw1", b"{}") for t in threads] + [(t, "gw2", b'{"x":{}}') for t in threads[::3]]
    )
    assert await presence.alive(["gw1", "gw2", "gw3"]) == {"gw1", "gw2"}
    seen = await presence.read_many([*threads, "th-many-none"], skip="gw1")
    assert seen["th-many-0"] == {"gw2": b'{"x":{}}'} and seen["th-many-1"] == {}
    assert seen["th-many-none"] == {}
    await asyncio.sleep(0.5)  # gw2 stops beating: its values no longer count, and are deleted
    assert await presence.alive(["gw1", "gw2"]) == {"gw1"}
    assert (await presence.read_many(["th-many-0"]))["th-many-0"] == {"gw1": b"{}"}
    assert not await presence.beat("gw2", 30)  # it beats again: told its beat had lapsed
    assert (await presence.read_many(["th-many-0"]))["th-many-0"] == {"gw1": b"{}"}


async def test_a_burst_beyond_the_connection_pool_waits_instead_of_failing(
    presence: RedisPresence,
) -> None:
    # redis-py refuses a command once its pool's 100 connections are busy: thousands of
    # websockets joining at once reread presence this many times concurrently.
    burst = 20 * MAX_IN_FLIGHT
    replies = await within(
        asyncio.gather(*(presence.read_many([f"th-burst-{i}"]) for i in range(burst))), timeout=30
    )
    assert replies == [{f"th-burst-{i}": {}} for i in range(burst)]


async def test_a_read_leaves_out_the_gateway_it_is_told_to_skip(presence: RedisPresence) -> None:
    for gateway in ("gw1", "gw2"):
        await presence.beat(gateway, 30)
    await presence.write_many([("th-skip", "gw1", b"{}"), ("th-skip", "gw2", b"{}")])
    assert await presence.read_many(["th-skip"], skip="gw1") == {"th-skip": {"gw2": b"{}"}}
    assert set((await presence.read_many(["th-skip"]))["th-skip"]) == {"gw1", "gw2"}
