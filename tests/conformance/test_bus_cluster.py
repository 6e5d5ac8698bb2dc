"""The Redis Cluster bus beyond the shared suite: sharding, a killed connection, a failover."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import suppress

import pytest
from redis.asyncio import Redis

from realtime import open_bus
from realtime.bus_errors import BusError
from realtime.channels import presence_key, replay_key, thread_channel
from realtime.counters import RedisCounters
from realtime.hub import Hub
from realtime.redis_cluster import RedisClusterBus
from tests.conformance.conftest_bus import (
    admin_cluster,
    cleanup_prefix,
    client_ids,
    eventually,
    make_cluster_bus,
    within,
)
from tests.conformance.test_hub import Recorder, chunk_frame
from tests.services import own_redis_cluster, require_redis_cluster

pytestmark = pytest.mark.redis


@pytest.fixture
async def cluster_bus() -> AsyncIterator[RedisClusterBus]:
    bus = make_cluster_bus()
    try:
        async with bus:
            yield bus
    finally:
        await cleanup_prefix(bus.prefix, cluster=True)


async def node_command(node: tuple[str, int], *args: str | bytes) -> object:
    client = Redis(host=node[0], port=node[1])
    try:
        return await client.execute_command(*args)
    finally:
        await client.aclose()


async def shard_subscribers(node: tuple[str, int], channel: bytes) -> int:
    reply = await node_command(node, "PUBSUB", "SHARDNUMSUB", channel)
    assert isinstance(reply, list)
    return int(reply[1])


async def masters() -> list[tuple[str, int]]:
    async with admin_cluster() as admin:
        return sorted((node.host, int(node.port)) for node in admin.get_primaries())


def test_open_bus_picks_the_cluster_backend() -> None:
    bus = open_bus("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", prefix="p:")
    assert isinstance(bus, RedisClusterBus)
    with pytest.raises(ValueError, match="host:port"):
        open_bus("redis+cluster://127.0.0.1")


async def test_a_thread_channel_is_sharded_and_lives_with_its_keys(
    cluster_bus: RedisClusterBus,
) -> None:
    channel = thread_channel("th-shard")
    full = (cluster_bus.prefix + channel).encode()
    owner = cluster_bus.shard_of(channel)
    async with cluster_bus.subscribe(channel) as subscription:
        for node in await masters():
            assert await shard_subscribers(node, full) == (1 if node == owner else 0)
            # Classic pub/sub is not used: nothing is broadcast across the cluster.
            assert await node_command(node, "PUBSUB", "NUMSUB", full) == [full, 0]
        await cluster_bus.publish(channel, b"hello")
        assert await within(anext(aiter(subscription))) == b"hello"
    # The thread's replay buffer and presence hash hash to the channel's slot, so its shard.
    slots = {
        await node_command(owner, "CLUSTER", "KEYSLOT", cluster_bus.prefix + name)
        for name in (channel, replay_key("th-shard"), presence_key("th-shard"))
    }
    assert len(slots) == 1


async def test_threads_spread_over_every_master(cluster_bus: RedisClusterBus) -> None:
    channels = [thread_channel(f"spread-{i}") for i in range(30)]
    assert {cluster_bus.shard_of(c) for c in channels} == set(await masters())


async def test_a_killed_shard_connection_reconnects_and_resubscribes(
    cluster_bus: RedisClusterBus,
) -> None:
    reconnects: list[bool] = []
    cluster_bus.add_reconnect_listener(lambda: reconnects.append(True))
    channel = thread_channel("th-kill")
    owner = cluster_bus.shard_of(channel)
    async with cluster_bus.subscribe(channel) as subscription:
        admin = Redis(host=owner[0], port=owner[1])
        try:
            ids = await client_ids(admin, cluster_bus.pubsub_client_name)
            assert len(ids) == 1  # one pub/sub connection per master, whatever the channels
            await admin.client_kill_filter(_id=str(ids[0]))
        finally:
            await admin.aclose()
        await eventually(lambda: reconnects == [True] and cluster_bus.healthy)
        await cluster_bus.publish(channel, b"after")
        assert await within(anext(aiter(subscription))) == b"after"


async def test_counters_refuse_keys_of_several_slots() -> None:
    counters = RedisCounters(require_redis_cluster(), f"test-limits-{uuid.uuid4().hex[:8]}:")
    try:
        with pytest.raises(ValueError, match="hash tag"):
            await counters.join(("token:a", "subject:b"), (1, 1), "m", ttl=5)
        assert await counters.join(("token:{s}:a", "subject:{s}"), (1, 1), "m", ttl=5) == -1
    finally:
        await counters.close()


class Versions:
    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    async def __call__(self, thread_ids: Sequence[str]) -> Mapping[str, int]:
        return {t: self.versions[t] for t in thread_ids if t in self.versions}


async def test_a_master_failover_is_survived_with_a_resync() -> None:
    """Kill the master of a watched thread's shard: its replica takes over, every bus
    reconnects, the hub tells its listeners to resync, and live delivery resumes."""
    cluster = own_redis_cluster()
    versions = Versions()
    publisher = make_cluster_bus(max_backoff=0.5)
    subscriber = make_cluster_bus(prefix=publisher.prefix, max_backoff=0.5)
    channel = thread_channel("th-failover")
    killed: int | None = None
    health: list[bool] = []
    try:
        async with (
            publisher,
            subscriber,
            Hub(subscriber, version_source=versions, poll_interval=0.05) as hub,
        ):
            recorder = Recorder()
            await hub.add("th-failover", recorder)
            await publisher.publish(channel, chunk_frame("th-failover", 0))
            await eventually(lambda: recorder.kinds() == ["chunk"])
            owner = subscriber.shard_of(channel)
            killed = owner[1]

            async def watch_health() -> None:
                while True:
                    if not health or health[-1] != subscriber.healthy:
                        health.append(subscriber.healthy)
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch_health())
            try:
                cluster.kill(killed)
                versions.versions["th-failover"] = 7  # committed while the shard is gone
                await eventually(lambda: False in health, timeout=10)
                await eventually(lambda: subscriber.shard_of(channel) != owner, timeout=20)
                await eventually(lambda: subscriber.healthy, timeout=20)
            finally:
                watcher.cancel()
            # The hub's poll loop sends the resync once the bus reports the reconnect: a moment
            # after `healthy`, not necessarily before.
            await eventually(lambda: "resync" in recorder.kinds(), timeout=10)
            await eventually(lambda: ("invalidate", 7) in [r[1:] for r in recorder.received])
            assert killed not in [port for _, port in await masters()]

            async def delivered_after_failover() -> None:
                # The publisher's client learns the new master on its first MOVED/refused
                # connection; until then a publish may fail (the publisher only logs those).
                while recorder.kinds()[-1] != "chunk":
                    with suppress(BusError):
                        await publisher.publish(channel, chunk_frame("th-failover", 1))
                    await asyncio.sleep(0.05)

            await within(delivered_after_failover(), timeout=20)
            print(f"failover: health transitions {health}, received {recorder.kinds()}")
    finally:
        if killed is not None:
            cluster.restart(killed)
            await asyncio.to_thread(cluster.wait_ready)
        await cleanup_prefix(publisher.prefix, cluster=True)
