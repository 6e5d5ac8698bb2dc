"""Presence on two (then three) gateways over Redis: who is here, typing, reviewing, leaving,
and a SIGKILLed gateway's members vanishing within the documented bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest

from tests.e2e import cluster, harness
from tests.services import require_postgres, require_redis
from threadline_client import ThreadlineClient, ThreadWatch

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
REFRESH = 1.0  # THREADLINE_PRESENCE_REFRESH: members of a dead gateway vanish within 2x this
TIMEOUT = 20.0


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]

    def client(self, name: str, gateway: harness.ServerHandle) -> ThreadlineClient:
        return ThreadlineClient(gateway.url, self.tokens[name])


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    require_redis()
    extra = {"THREADLINE_PRESENCE_REFRESH": str(REFRESH)}
    with cluster.cluster(["gateway", "gateway", "worker"], extra=extra) as running:
        tokens = running.tokens(
            {
                "alice": ("alpha", "user", "alice"),
                "bob": ("alpha", "user", "bob", "Bob Marsh"),
                "svc": ("alpha", "backend", "svc"),
            }
        )
        yield Setup(running, tokens)


def present(watch: ThreadWatch) -> dict[str, int]:
    return {subject: m.connections for subject, m in watch.presence.items()}


async def test_everyone_sees_everyone_typing_reviewing_and_leaving(setup: Setup) -> None:
    g1, g2 = setup.cluster.gateways[:2]
    async with AsyncExitStack() as stack:
        alice = await stack.enter_async_context(setup.client("alice", g1))
        thread_id = (await alice.create_thread("presence")).thread.id
        places = [("alice", g1), ("alice", g2), ("bob", g2), ("svc", g1)]
        watches: list[ThreadWatch] = []
        for name, gateway in places:
            client = await stack.enter_async_context(setup.client(name, gateway))
            watches.append(await stack.enter_async_context(client.watch(thread_id)))
        everyone = {"alice": 2, "bob": 1, "svc": 1}  # two tabs of alice are one member
        for watch in watches:
            await watch.until(lambda w: present(w) == everyone, TIMEOUT)
        assert watches[0].presence["svc"].role == "backend"
        # The token's display name is what others see; the subject stays the member's key.
        assert watches[0].presence["bob"].name == "Bob Marsh"
        assert watches[0].presence["alice"].name == "alice"  # no display name: the subject

        bob = watches[2]
        await bob.set_presence(typing=True)
        for watch in watches:
            await watch.until(lambda w: w.presence["bob"].typing is True, TIMEOUT)
        await bob.set_presence(typing=False, reviewing="act_123")
        await watches[0].until(
            lambda w: (
                w.presence["bob"].typing is False and w.presence["bob"].reviewing == "act_123"
            ),
            TIMEOUT,
        )
        # A burst of updates coalesces: the last state wins, far fewer frames than updates.
        before = sum(1 for e in list(watches[0]._events) if e.kind == "presence")
        for i in range(30):
            await bob.set_presence(typing=i % 2 == 0)
        await bob.set_presence(typing=True)
        await watches[0].until(lambda w: w.presence["bob"].typing is True, TIMEOUT)
        await asyncio.sleep(0.5)
        after = sum(1 for e in list(watches[0]._events) if e.kind == "presence")
        assert after - before < 15, (before, after)

        await watches[1].aclose()  # one of alice's tabs closes: she is still here, once
        await watches[0].until(lambda w: present(w).get("alice") == 1, TIMEOUT)
        await bob.aclose()
        await watches[0].until(lambda w: "bob" not in w.presence, TIMEOUT)
        await watches[3].until(lambda w: present(w) == {"alice": 1, "svc": 1}, TIMEOUT)


async def test_a_sigkilled_gateways_members_vanish_within_two_refresh_intervals(
    setup: Setup,
) -> None:
    g1 = setup.cluster.gateways[0]
    (g3,) = setup.cluster.start(["gateway"])
    async with (
        setup.client("alice", g1) as alice,
        setup.client("bob", g3) as bob_client,
    ):
        thread_id = (await alice.create_thread("kill")).thread.id
        async with alice.watch(thread_id) as watch, bob_client.watch(thread_id) as bob:
            await watch.until(lambda w: "bob" in w.presence, TIMEOUT)
            await bob.until(lambda w: "alice" in w.presence, TIMEOUT)
            g3.process.kill()
            killed_at = time.monotonic()
            await asyncio.to_thread(g3.process.wait, 10)
            await watch.until(lambda w: "bob" not in w.presence, TIMEOUT)
            elapsed = time.monotonic() - killed_at
            assert present(watch) == {"alice": 1}
    setup.cluster.processes.remove(g3)
    g3.stop()
    # The bound is 2 refresh intervals; a little slack for the frame's way to the client.
    assert elapsed <= 2 * REFRESH + 0.5, elapsed
