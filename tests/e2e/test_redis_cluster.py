"""Two gateways and a worker on a Redis Cluster: one stream for all, and a master failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack

import httpx
import pytest
from redis.crc import key_slot

from realtime.channels import thread_channel
from tests.e2e import cluster
from tests.e2e.follower import Follower
from tests.e2e.test_multiprocess import (
    Setup,
    assert_monotonic,
    assistant_text,
    new_watched_thread,
    post,
    reply_text,
    stream_of,
    wait_status,
)
from tests.services import own_redis_cluster, require_postgres, require_redis_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    extra = {"THREADLINE_REDIS_URL": require_redis_cluster(), "THREADLINE_DEMO_DELAY_MS": "20"}
    with cluster.cluster(["gateway", "gateway", "worker"], extra=extra) as running:
        tokens = running.tokens(
            {"alice": ("alpha", "user", "alice"), "bob": ("alpha", "user", "bob")}
        )
        yield Setup(running, tokens)
        for process in running.processes:
            assert process.alive(), f"{process.role} died\n{running.logs()}"


@pytest.fixture
async def followers(setup: Setup) -> AsyncIterator[list[Follower]]:
    places = [(setup.g1, "alice"), (setup.g2, "bob")]
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                Follower(gateway.url, gateway.ws_url, setup.tokens[name], f"{name}@{gateway.port}")
            )
            for gateway, name in places
        ]


async def test_both_gateways_stream_a_run_over_the_cluster(
    setup: Setup, followers: list[Follower]
) -> None:
    thread_id = await new_watched_thread(setup, followers)
    text = "sharded hello " * 3
    sent = await post(
        setup.g2, setup.tokens["bob"], f"/v1/threads/{thread_id}/messages", {"text": text}
    )
    final = await wait_status(followers[0], "completed")
    for follower in followers:
        await follower.converge(final)
    streams = [stream_of(f, sent["run_id"]) for f in followers]
    assert streams[0] == streams[1] and len(streams[0]) > 5
    assert reply_text(streams[0]) == assistant_text(final) == f"You said: {text}"


async def test_a_master_failover_mid_stream_converges(
    setup: Setup, followers: list[Follower]
) -> None:
    server = own_redis_cluster()
    thread_id = await new_watched_thread(setup, followers)
    # The master owning the thread's shard: its channel and replay buffer die with it.
    owner = server.master_of(key_slot(("threadline:" + thread_channel(thread_id)).encode()))
    text = " ".join(f"word{i:03d}" for i in range(90))  # ~150 pieces, about 3 s of streaming
    sent = await post(
        setup.g1, setup.tokens["alice"], f"/v1/threads/{thread_id}/messages", {"text": text}
    )
    run_id = sent["run_id"]
    for follower in followers:
        await follower.wait_for(lambda f: len(f.chunks(run_id)) >= 10)
    server.kill(owner)
    try:
        for follower in followers:
            await follower.wait_for(lambda f: f.reasons["resync"] >= 1, timeout=30)
        final = await wait_status(followers[0], "completed", timeout=40)
        for follower in followers:
            await follower.converge(final)
            assert_monotonic(follower, sent["version"] - 1, final["thread"]["version"])
            assert follower.close_code is None, f"{follower.name} was closed"
        assert assistant_text(final) == f"You said: {text}"
        async with httpx.AsyncClient(timeout=5) as client:
            for process in setup.cluster.processes:
                for _ in range(200):
                    health = (await client.get(f"{process.url}/healthz")).json()
                    if health["bus_healthy"]:
                        break
                    await asyncio.sleep(0.05)
                assert health["bus_healthy"] is True, (process.role, health)
    finally:
        server.restart(owner)
        await asyncio.to_thread(server.wait_ready)
