"""Two gateway processes and a worker on Postgres + Redis: shared streams, resumes, bus outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e import cluster
from tests.e2e.follower import Follower
from tests.e2e.harness import ServerHandle
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

RUN_TIMEOUT = 20.0
# The demo agent streams 5-character pieces; a pause between them keeps a reply in flight long
# enough to act on it mid-stream.
DELAY_MS = "20"


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]

    @property
    def g1(self) -> ServerHandle:
        return self.cluster.gateways[0]

    @property
    def g2(self) -> ServerHandle:
        return self.cluster.gateways[1]


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    require_redis()
    with cluster.cluster(
        ["gateway", "gateway", "worker"], extra={"THREADLINE_DEMO_DELAY_MS": DELAY_MS}
    ) as running:
        tokens = running.tokens(
            {
                "alice": ("alpha", "user", "alice"),
                "bob": ("alpha", "user", "bob"),
                "svc": ("alpha", "backend", "svc"),
            }
        )
        yield Setup(running, tokens)
        for process in running.processes:
            assert process.alive(), f"{process.role} died\n{running.logs()}"


@pytest.fixture
async def followers(setup: Setup) -> AsyncIterator[list[Follower]]:
    """alice on gateway 1, bob on gateway 2, alice again on gateway 2."""
    places = [(setup.g1, "alice"), (setup.g2, "bob"), (setup.g2, "alice")]
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                Follower(gateway.url, gateway.ws_url, setup.tokens[name], f"{name}@{gateway.port}")
            )
            for gateway, name in places
        ]


async def post(gateway: ServerHandle, token: str, path: str, body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        response = await client.post(path, json=body)
    assert response.status_code in (200, 201, 202), response.text
    return dict(response.json())


async def wait_status(
    follower: Follower, status: str, timeout: float = RUN_TIMEOUT
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = await follower.server_snapshot()
        run = snapshot["run"]
        if run is not None and run["status"] == status and not snapshot["queue"]:
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"run never became {status}: {snapshot}")


async def new_watched_thread(setup: Setup, followers: list[Follower]) -> str:
    created = await post(setup.g1, setup.tokens["alice"], "/v1/threads", {"title": "mp"})
    thread_id = str(created["thread"]["id"])
    for follower in followers:
        assert (await follower.subscribe(thread_id))["version"] == created["thread"]["version"]
    return thread_id


def stream_of(follower: Follower, run_id: str) -> list[tuple[str, int, dict[str, Any]]]:
    return [(f["run_id"], f["seq"], f["chunk"]) for f in follower.chunks(run_id)]


def reply_text(chunks: list[tuple[str, int, dict[str, Any]]]) -> str:
    return "".join(c["delta"] for _, _, c in chunks if c["type"] == "text-delta")


def assistant_text(snapshot: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for message in snapshot["messages"]
        if message["role"] == "assistant"
        for part in message["parts"]
    )


def assert_monotonic(follower: Follower, floor: int, final: int) -> None:
    versions = follower.invalidations()
    assert versions == sorted(set(versions)), (follower.name, versions)
    assert all(floor < v <= final for v in versions), (follower.name, floor, versions, final)


async def test_gateways_deliver_the_same_stream(setup: Setup, followers: list[Follower]) -> None:
    thread_id = await new_watched_thread(setup, followers)
    text = "hello from gateway one " * 4
    sent = await post(
        setup.g1, setup.tokens["alice"], f"/v1/threads/{thread_id}/messages", {"text": text}
    )
    run_id = sent["run_id"]
    final = await wait_status(followers[1], "completed")
    version = final["thread"]["version"]
    for follower in followers:
        await follower.wait_for(lambda f: version in f.invalidations())
        await follower.converge(final)
    streams = [stream_of(f, run_id) for f in followers]
    assert streams[0] == streams[1] == streams[2]
    seqs = [seq for _, seq, _ in streams[0]]
    assert seqs == list(range(len(seqs))) and len(seqs) > 5
    kinds = [chunk["type"] for _, _, chunk in streams[0]]
    assert kinds[0] == "step-start" and kinds[-1] == "step-finish"
    assert reply_text(streams[0]) == assistant_text(final) == f"You said: {text}"
    assert final["run"]["next_seq"] == len(seqs)
    # Invalidations coalesce in a busy outbox, so each connection may skip versions, but every
    # one saw the final version, in increasing order, and nothing older than it subscribed at.
    for follower in followers:
        assert_monotonic(follower, sent["version"] - 1, version)
        assert follower.invalidations()[-1] == version


async def test_action_resumed_through_the_other_gateway(
    setup: Setup, followers: list[Follower]
) -> None:
    thread_id = await new_watched_thread(setup, followers)
    sent = await post(
        setup.g1,
        setup.tokens["alice"],
        f"/v1/threads/{thread_id}/messages",
        {"text": "please email someone@example.com the minutes"},
    )
    waiting = await wait_status(followers[1], "waiting")
    (action,) = waiting["pending_actions"]
    assert action["tool_name"] == "send_email" and action["kind"] == "approval"
    resumed = await post(
        setup.g2,
        setup.tokens["svc"],
        f"/v1/threads/{thread_id}/actions/{action['id']}/resume",
        {"payload": {"approved": True, "note": "via gateway 2"}},
    )
    assert resumed["version"] > waiting["thread"]["version"]
    final = await wait_status(followers[0], "completed")
    assert final["run"]["id"] == sent["run_id"] and final["pending_actions"] == []
    for follower in followers:
        await follower.converge(final)
    assert followers[0].snapshot == followers[1].snapshot == followers[2].snapshot == final
    (part,) = [p for m in final["messages"] for p in m["parts"] if p["type"] == "tool-call"]
    assert part["state"] == "output-available"
    assert part["waiting"]["resolution"]["subject"] == "svc"
    assert "Done: I sent the email" in assistant_text(final)
    assert "someone@example.com" not in assistant_text(final)
    # Both episodes' chunks reached every gateway's clients alike.
    streams = [stream_of(f, sent["run_id"]) for f in followers]
    assert streams[0] == streams[1] == streams[2]
    assert [seq for _, seq, _ in streams[0]] == list(range(len(streams[0])))
    for follower in followers:
        assert_monotonic(follower, sent["version"] - 1, final["thread"]["version"])


async def test_killed_bus_connections_still_converge(
    setup: Setup, followers: list[Follower]
) -> None:
    thread_id = await new_watched_thread(setup, followers)
    text = " ".join(f"word{i:03d}" for i in range(90))  # ~150 pieces, about 3 s of streaming
    sent = await post(
        setup.g2, setup.tokens["bob"], f"/v1/threads/{thread_id}/messages", {"text": text}
    )
    run_id = sent["run_id"]
    for follower in followers:
        await follower.wait_for(lambda f: len(f.chunks(run_id)) >= 15)
    pids = [p.process.pid for p in setup.cluster.processes]
    killed = await cluster.kill_redis_clients(pids)
    assert len(killed) == len(pids), killed  # exactly one pub/sub connection per process
    # Once they are back, a second outage takes the command connections along as well.
    await asyncio.sleep(0.5)
    for follower in followers:
        await follower.wait_for(lambda f: f.reasons["resync"] >= 1)
    killed = await cluster.kill_redis_clients(pids, ("-pubsub", "-cmd"))
    assert len(killed) >= len(pids), killed
    # Both outages hit the reply while it streamed.
    snapshot = await followers[0].server_snapshot()
    assert snapshot["run"]["status"] == "running", snapshot["run"]
    final = await wait_status(followers[0], "completed")
    for follower in followers:
        await follower.converge(final)
    assert assistant_text(final) == f"You said: {text}"
    assert [m["role"] for m in final["messages"]] == ["user", "assistant"]
    for follower in followers:
        assert_monotonic(follower, sent["version"] - 1, final["thread"]["version"])
        assert follower.close_code is None, f"{follower.name} was closed"
    async with httpx.AsyncClient(timeout=5) as client:
        for process in setup.cluster.processes:
            health = (await client.get(f"{process.url}/healthz")).json()
            assert health["bus_healthy"] is True, (process.role, health)
