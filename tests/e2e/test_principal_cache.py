"""The gateways' principal cache (server/auth_cache.py) never outlives a revocation: with a cache
that would keep a token for an hour, the revoked token is refused on every gateway, whether it
was revoked through a gateway's route or with `threadline token revoke`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from realtime.closecodes import CloseCode
from tests.e2e import cluster, harness
from tests.e2e.harness import ServerHandle
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

# Long enough that only the revocation can make a gateway forget a token within the test.
CACHE_TTL = "3600"


@pytest.fixture(scope="module")
def deployment() -> Iterator[cluster.Cluster]:
    require_postgres()
    require_redis()
    extra = {"THREADLINE_AUTH_CACHE_TTL": CACHE_TTL}
    with cluster.cluster(["gateway", "gateway", "worker"], extra=extra) as running:
        yield running


def mint(deployment: cluster.Cluster, tenant: str, role: str = "user") -> str:
    return deployment.tokens({"t": (tenant, role, f"u-{uuid.uuid4().hex[:6]}")})["t"]


async def me(gateway: ServerHandle, token: str) -> int:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        answer = await http.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    return answer.status_code


async def open_ws(gateway: ServerHandle, token: str) -> ClientConnection:
    subprotocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{token}")]
    ws = await connect(gateway.ws_url, subprotocols=subprotocols)
    await ws.send('{"type": "ping"}')
    await ws.recv()
    return ws


async def close_code(ws: ClientConnection) -> int | None:
    """The code the gateway closes `ws` with (bounded: None if it stays open 10 s)."""
    try:
        for _ in range(1000):
            await asyncio.wait_for(ws.recv(), 10)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None
    except TimeoutError:
        return None
    return None


@pytest.mark.parametrize("how", ["route", "cli"])
async def test_a_revoked_token_is_refused_on_every_gateway_despite_the_cache(
    deployment: cluster.Cluster, how: str
) -> None:
    tenant = f"s-{uuid.uuid4().hex[:8]}"
    token, admin = mint(deployment, tenant), mint(deployment, tenant, role="admin")
    g1, g2 = deployment.gateways
    # Both gateways have read the token, so both hold its principal.
    assert [await me(g1, token), await me(g2, token)] == [200, 200]
    watcher = await open_ws(g2, token)  # closes once g2 has heard the broadcast
    if how == "route":
        async with httpx.AsyncClient(base_url=g1.url, timeout=30) as http:
            answer = await http.post(
                "/v1/tokens/revoke",
                json={"token": token},
                headers={"Authorization": f"Bearer {admin}"},
            )
        assert answer.status_code == 200, answer.text
        # The revoking gateway forgets the token before it answers: its next request fails.
        assert await me(g1, token) == 401
    else:
        done = harness.run_command(["token", "revoke", token], deployment.env)
        assert done.returncode == 0, done.stderr
    # The broadcast that closes the token's websockets makes every gateway forget it first.
    assert await close_code(watcher) == CloseCode.TOKEN_REVOKED
    assert [await me(g1, token), await me(g2, token)] == [401, 401]
    # Another token of the same tenant is still served (from the cache or not).
    assert await me(g2, admin) == 200
