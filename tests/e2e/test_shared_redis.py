"""Two deployments on one Redis (and on one Redis Cluster), told apart only by
THREADLINE_REDIS_PREFIX: no frame, presence entry or revocation of one reaches the other.

To make a leak possible the two share one database, so the same thread and the same tokens
exist in both: without prefixes, a follower of deployment B would receive deployment A's
chunks, see A's members and hear A's revocations (the Redis names would be the same).
Deployment B runs a gateway only, so A's runs are executed, and published, by A alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from realtime import connect_bus, open_bus
from realtime.bus import Subscription
from realtime.closecodes import CloseCode
from server.live.revocation import TOKENS_CHANNEL
from tests.e2e import cluster, harness
from tests.e2e.follower import Follower
from tests.services import require_postgres, require_redis, require_redis_cluster, unique_prefix

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@dataclass
class Deployments:
    redis_url: str
    a: cluster.Cluster
    b: cluster.Cluster
    prefixes: tuple[str, str]
    tokens: dict[str, str]


@pytest.fixture(scope="module", params=["redis", "cluster"])
def deployments(request: pytest.FixtureRequest) -> Iterator[Deployments]:
    require_postgres()
    redis_url = require_redis() if request.param == "redis" else require_redis_cluster()
    prefixes = (unique_prefix(), unique_prefix())
    with cluster.postgres_database() as database_url:
        running = []
        try:
            for prefix, roles in zip(prefixes, (["all"], ["gateway"]), strict=True):
                extra = {"THREADLINE_REDIS_PREFIX": prefix}
                env = cluster.cluster_env(database_url, redis_url, extra)
                deployment = cluster.Cluster(env, Path(tempfile.mkdtemp(prefix="threadline-dep-")))
                running.append(deployment)
                deployment.start(roles)
            a, b = running
            names = ["alice", "bob", "carol", "revoked"]
            tokens = a.tokens({name: ("shared", "user", name) for name in names})
            yield Deployments(redis_url, a, b, prefixes, tokens)
            for deployment in running:
                for process in deployment.processes:
                    assert process.alive(), f"{process.role} died\n{deployment.logs()}"
        finally:
            for deployment in running:
                deployment.stop()


@contextlib.asynccontextmanager
async def follower(gateway: harness.ServerHandle, token: str, name: str) -> AsyncIterator[Follower]:
    async with Follower(gateway.url, gateway.ws_url, token, name) as f:
        yield f


def presence_subjects(f: Follower) -> set[str]:
    """Every subject `f` was told about in presence frames."""
    seen: set[str] = set()
    for received in f.frames:
        frame = received.frame
        if frame.get("type") == "presence":
            seen |= {member["subject"] for member in frame["members"]}
        elif frame.get("type") in ("presence.join", "presence.update"):
            seen.add(frame["member"]["subject"])
        elif frame.get("type") == "presence.leave":
            seen.add(frame["subject"])
    return seen


async def test_frames_and_presence_of_one_deployment_never_reach_the_other(
    deployments: Deployments,
) -> None:
    (a,), (b,) = deployments.a.gateways, deployments.b.gateways
    tokens = deployments.tokens
    async with httpx.AsyncClient(
        base_url=a.url, headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=30
    ) as http:
        thread_id = (await http.post("/v1/threads", json={})).json()["thread"]["id"]
        async with (
            follower(a, tokens["alice"], "alice@a") as alice,
            follower(b, tokens["bob"], "bob@b") as bob,
        ):
            await alice.subscribe(thread_id)
            await bob.subscribe(thread_id)
            # A third member joins A after Bob joined B: once Alice hears of Carol, she would
            # have heard of Bob too if presence crossed deployments.
            async with follower(a, tokens["carol"], "carol@a") as carol:
                await carol.subscribe(thread_id)
                await alice.wait_for(lambda f: "carol" in presence_subjects(f))
                sent = await http.post(
                    f"/v1/threads/{thread_id}/messages", json={"text": "hello over A"}
                )
                assert sent.status_code == 202, sent.text
                run_id = sent.json()["run_id"]

                def finished(f: Follower) -> bool:
                    run = (f.snapshot or {}).get("run") or {}
                    return run.get("id") == run_id and run.get("status") == "completed"

                await alice.wait_for(finished)
                await carol.wait_for(finished)
            # Bob's socket would have had them by now: the same Redis, published moments ago.
            await asyncio.sleep(0.5)
    streamed = len(alice.chunks(run_id))
    print(
        f"\ntwo deployments on {deployments.redis_url.split('://')[0]}: A streamed {streamed}"
        f" chunks and {len(alice.invalidations())} invalidations; B saw {len(bob.live())}"
        f" live frames; presence A {sorted(presence_subjects(alice))},"
        f" B {sorted(presence_subjects(bob))}"
    )
    assert streamed > 0 and alice.invalidations()
    assert bob.live() == []
    assert presence_subjects(alice) == {"alice", "carol"}
    assert presence_subjects(bob) == {"bob"}


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_revocation_of_one_deployment_is_not_heard_by_the_other(
    deployments: Deployments,
) -> None:
    heard: dict[str, list[bytes]] = {prefix: [] for prefix in deployments.prefixes}
    got = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        for prefix in deployments.prefixes:
            bus = open_bus(deployments.redis_url, prefix=prefix)
            await connect_bus(bus, timeout=10)
            stack.push_async_callback(bus.close)
            subscription = await stack.enter_async_context(bus.subscribe(TOKENS_CHANNEL))

            async def listen(into: list[bytes], subscription: Subscription = subscription) -> None:
                async for data in subscription:
                    into.append(data)
                    got.set()

            stack.push_async_callback(stopped, asyncio.create_task(listen(heard[prefix])))

        (a,) = deployments.a.gateways
        token = deployments.tokens["revoked"]
        async with follower(a, token, "revoked@a") as victim:
            done = await asyncio.to_thread(
                harness.run_command, ["token", "revoke", token], deployments.a.env
            )
            assert done.returncode == 0, done.stderr
            await victim.wait_for(lambda f: f.close_code is not None)
            await asyncio.wait_for(got.wait(), 10)
            await asyncio.sleep(0.5)  # B's channel would have it by now
    mine, theirs = (heard[prefix] for prefix in deployments.prefixes)
    assert victim.close_code == CloseCode.TOKEN_REVOKED
    assert len(mine) == 1 and theirs == []
