"""The gateway's snapshot cache against a real server: conditional reads (ETag, 304), viewers
with different permissions never served each other's snapshot, a scope never served another's,
and one storage read for many refetches of a watched thread (counted at /metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.e2e import harness
from tests.e2e.prometheus_server import snapshot_reads

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory = tmp_path_factory.mktemp("server")
    # Hiding a message is for its author only: alice and bob see different permissions.
    env = harness.server_env(
        harness.sqlite_url(directory), {"THREADLINE_PERMISSION_VISIBILITY": "author"}
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    return {
        "alice": server.token("alpha", subject="alice"),
        "bob": server.token("alpha", subject="bob"),
        "carol": server.token("beta", subject="carol"),
    }


def client(server: harness.ServerHandle, token: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=TIMEOUT)


def reads(server: harness.ServerHandle) -> dict[str, float]:
    """The server's snapshot answers by source (storage, cache), from its /metrics."""
    return snapshot_reads(server.url)


@pytest.fixture
async def watched(
    server: harness.ServerHandle, tokens: dict[str, str]
) -> AsyncIterator[tuple[str, ClientConnection]]:
    """A thread with alice's message and the demo's reply, watched over a websocket."""
    async with client(server, tokens["alice"]) as alice:
        thread_id = (await alice.post("/v1/threads", json={"title": "cached"})).json()["thread"][
            "id"
        ]
        url = f"{server.ws_url}?token={tokens['alice']}"
        async with connect(url, open_timeout=TIMEOUT) as ws:
            await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id}).decode())
            await until(ws, "subscribed")
            await alice.post(f"/v1/threads/{thread_id}/messages", json={"text": "hello there"})
            for _ in range(200):  # bounded: the run's invalidations, then its end
                frame = await until(ws, "invalidate")
                snapshot = (await alice.get(f"/v1/threads/{thread_id}")).json()
                if (
                    snapshot["thread"]["version"] >= frame["version"]
                    and (snapshot["run"] or {}).get("status") == "completed"
                ):
                    break
            yield thread_id, ws


async def until(ws: ClientConnection, kind: str) -> dict[str, object]:
    for _ in range(1000):
        frame: dict[str, object] = orjson.loads(await ws.recv(decode=True))
        if frame["type"] == kind:
            return frame
    raise AssertionError(f"no {kind} frame")


async def test_etag_and_304(
    server: harness.ServerHandle, tokens: dict[str, str], watched: tuple[str, ClientConnection]
) -> None:
    thread_id, _ = watched
    path = f"/v1/threads/{thread_id}"
    async with client(server, tokens["alice"]) as alice, client(server, tokens["bob"]) as bob:
        first = await alice.get(path)
        tag = first.headers["etag"]
        assert first.status_code == 200 and tag.startswith(
            f'"v{first.json()["thread"]["version"]}.'
        )
        assert first.headers["cache-control"] == "private, no-cache"
        same = await alice.get(path, headers={"If-None-Match": tag})
        assert same.status_code == 304 and same.content == b"" and same.headers["etag"] == tag
        # Another viewer's tag never matches: their snapshots differ in what each may do.
        other = await bob.get(path, headers={"If-None-Match": tag})
        assert other.status_code == 200 and other.headers["etag"] != tag
        # A commit through this gateway: the next read is the new version at once, even
        # before the invalidation arrives.
        renamed = await alice.patch(path, json={"title": "renamed"})
        assert renamed.status_code == 200, renamed.text
        after = await alice.get(path, headers={"If-None-Match": tag})
        assert after.status_code == 200 and after.json()["thread"]["title"] == "renamed"
        assert after.json()["thread"]["version"] == renamed.json()["version"]
        assert after.headers["etag"] != tag
        # A bad id still answers the table's error, not a 304.
        missing = await alice.get("/v1/threads/thr_missing", headers={"If-None-Match": "*"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_viewers_never_get_each_others_snapshot(
    server: harness.ServerHandle, tokens: dict[str, str], watched: tuple[str, ClientConnection]
) -> None:
    thread_id, _ = watched
    path = f"/v1/threads/{thread_id}"
    async with (
        client(server, tokens["alice"]) as alice,
        client(server, tokens["bob"]) as bob,
        client(server, tokens["carol"]) as carol,
    ):
        base = reads(server)
        answers: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": []}
        for _ in range(10):  # interleaved, so a shared entry would hand one's to the other
            answers["alice"].append((await alice.get(path)).json())
            answers["bob"].append((await bob.get(path)).json())
            refused = await carol.get(path)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        counted = reads(server)
    user_message = next(m["id"] for m in answers["alice"][0]["messages"] if m["role"] == "user")
    for snapshot in answers["alice"]:
        assert user_message in snapshot["permissions"]["visibility"]
    for snapshot in answers["bob"]:
        assert user_message not in snapshot["permissions"]["visibility"]
        assert snapshot["messages"] == answers["alice"][0]["messages"]
    # Thirty reads of a watched thread at one version: the two viewers' twenty from one storage
    # read (or two, if the first raced an invalidation), carol's ten refused by storage.
    storage = counted["storage"] - base["storage"]
    cached = counted["cache"] - base["cache"]
    assert storage <= 12, counted
    assert cached >= 18, counted
