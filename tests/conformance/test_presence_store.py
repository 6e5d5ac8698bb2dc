"""The Redis presence store on one Redis and on a Redis Cluster: entries, expiry, bursts."""

from __future__ import annotations

import asyncio
import time
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


async def test_entries_of_many_threads_are_written_read_and_removed(
    presence: RedisPresence,
) -> None:
    live = {"expires_at": time.time() + 30, "name": "ada"}
    gone = {"expires_at": time.time() - 1, "name": "bob"}
    threads = [f"th-presence-{i}" for i in range(12)]  # one pipeline across slots
    await presence.put_many([(t, "m1", live) for t in threads] + [(threads[0], "m2", gone)])
    for thread_id in threads:
        assert await presence.read(thread_id) == {"m1": live}  # the expired entry is skipped
    await presence.remove(threads[0], "m1")
    assert await presence.read(threads[0]) == {}


async def test_many_threads_are_read_together_as_one_by_one(presence: RedisPresence) -> None:
    live = {"expires_at": time.time() + 30, "name": "ada"}
    gone = {"expires_at": time.time() - 1, "name": "bob"}
    threads = [f"th-many-{i}" for i in range(40)]  # spread over a cluster's slots
    await presence.put_many(
        [(t, f"gw1-{i}", live) for i, t in enumerate(threads)]
        + [(t, "gw2-1", live) for t in threads[::3]]
        + [(threads[1], "gw2-9", gone)]
    )
    together = await presence.read_many([*threads, "th-many-none"], skip="gw1-")
    one_by_one = {t: await presence.read(t, skip="gw1-") for t in [*threads, "th-many-none"]}
    assert together == one_by_one
    assert together["th-many-0"] == {"gw2-1": live} and together["th-many-1"] == {}
    assert await presence.read_many([]) == {}


async def test_a_burst_beyond_the_connection_pool_waits_instead_of_failing(
    presence: RedisPresence,
) -> None:
    # redis-py refuses a command once its pool's 100 connections are busy: thousands of
    # websockets joining at once reread presence this many times concurrently.
    burst = 20 * MAX_IN_FLIGHT
    replies = await within(
        asyncio.gather(*(presence.read(f"th-burst-{i}") for i in range(burst))), timeout=30
    )
    assert replies == [{}] * burst


async def test_a_read_leaves_out_the_entries_it_is_told_to_skip(presence: RedisPresence) -> None:
    live = {"expires_at": time.time() + 30, "name": "ada"}
    await presence.put_many(
        [("th-skip", "gw1-1", live), ("th-skip", "gw1-2", live), ("th-skip", "gw2-1", live)]
    )
    assert await presence.read("th-skip", skip="gw1-") == {"gw2-1": live}
    assert set(await presence.read("th-skip")) == {"gw1-1", "gw1-2", "gw2-1"}
