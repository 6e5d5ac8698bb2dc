"""Websocket caps against a real server, on the in-process and the Redis counters: the subject
cap counts a subject within its scopes (one name in two scopes is two subjects), and the
per-token cap still holds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack

import pytest

from realtime.closecodes import CloseCode
from tests.e2e import cluster, harness
from tests.e2e.capped_sockets import opened, refused_with
from tests.services import require_postgres, unique_prefix

PER_TOKEN = 3
PER_SUBJECT = 5
CAPS = {
    "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": str(PER_TOKEN),
    "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": str(PER_SUBJECT),
}


@pytest.fixture(
    scope="module",
    params=["memory", pytest.param("redis", marks=[pytest.mark.postgres, pytest.mark.redis])],
)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.ServerHandle]:
    if request.param == "memory":
        database = harness.sqlite_url(tmp_path_factory.mktemp("caps"))
        with harness.start("all", harness.server_env(database, CAPS)) as server:
            yield server
        return
    require_postgres()
    # A prefix of our own: no other run's connection sets on this Redis count against ours.
    extra = {**CAPS, "THREADLINE_REDIS_PREFIX": unique_prefix()}
    with cluster.cluster(["all"], extra=extra) as running:
        yield running.gateways[0]


async def test_a_subject_cap_is_per_scope_and_the_token_cap_still_holds(
    gateway: harness.ServerHandle,
) -> None:
    subject = "shared"
    a1, a2, b1 = (
        gateway.token("caps-a", subject=subject),
        gateway.token("caps-a", subject=subject),
        gateway.token("caps-b", subject=subject),
    )
    async with AsyncExitStack() as stack:

        async def keep(token: str) -> None:
            ws = await opened(gateway, token)
            stack.push_async_callback(ws.close)

        for token in [a1] * PER_TOKEN + [a2] * (PER_SUBJECT - PER_TOKEN):
            await keep(token)
        # Scope a's `shared` is full: a fresh token of it is refused on the subject cap...
        assert await refused_with(gateway, a2) == CloseCode.TOO_MANY_CONNECTIONS
        # ...while scope b's `shared` is somebody else, with its own budget.
        for _ in range(PER_TOKEN):
            await keep(b1)
        # whose per-token cap still holds.
        assert await refused_with(gateway, b1) == CloseCode.TOO_MANY_CONNECTIONS
