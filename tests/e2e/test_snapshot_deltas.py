"""Snapshot deltas against a real server: watchers that subscribed with `"deltas": true` and
apply the deltas of their invalidations end, after every kind of commit (rename, metadata, a
run's steps, hide, unhide, regenerate, an approval), on exactly the snapshot a fresh read
answers them, mostly without refetching; each viewer's deltas carry only what its own
snapshot shows (alice's permissions never reach bob, a hidden message's text reaches nobody)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.e2e import harness
from threadline_client import ThreadlineClient
from threadline_client.watch import ThreadWatch

TIMEOUT = 20.0
HIDDEN_TEXT = "my secret plan for the weather"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory = tmp_path_factory.mktemp("server")
    # Hiding a message is for its author only: alice's and bob's snapshots differ.
    env = harness.server_env(
        harness.sqlite_url(directory), {"THREADLINE_PERMISSION_VISIBILITY": "author"}
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


def normal(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


class Bob:
    """Bob's raw websocket, subscribed with deltas: every invalidation frame it got."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []


@contextlib.asynccontextmanager
async def raw_watch(server: harness.ServerHandle, token: str, thread_id: str) -> AsyncIterator[Bob]:
    bob = Bob()
    async with connect(f"{server.ws_url}?token={token}", open_timeout=TIMEOUT) as ws:
        frame = {"type": "subscribe", "thread_id": thread_id, "deltas": True}
        await ws.send(orjson.dumps(frame).decode())

        async def read() -> None:
            async for data in ws:
                got = orjson.loads(data)
                if got.get("type") == "invalidate":
                    bob.frames.append(got)

        reader = asyncio.create_task(read())
        try:
            yield bob
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


async def converged(watch: ThreadWatch, http: httpx.AsyncClient, thread_id: str) -> int:
    """Wait until the watch holds what a fresh read answers; check they are byte-equal."""
    for _ in range(400):  # bounded: the run's commits, then quiet
        fresh = await http.get(f"/v1/threads/{thread_id}")
        body = fresh.json()
        version = body["thread"]["version"]
        run = body["run"] or {}
        if run.get("status") in ("queued", "running"):
            await asyncio.sleep(0.05)
            continue

        def caught_up(w: ThreadWatch, v: int = version) -> bool:
            return w.settled and w.state.version >= v

        with contextlib.suppress(TimeoutError):
            await watch.until(caught_up, 5)
        if watch.state.version == version:
            assert watch._wire is not None
            assert normal(watch._wire) == normal(body)
            return int(version)
    raise AssertionError(f"{thread_id} never converged")


async def test_deltas_converge_to_fresh_reads_and_leak_nothing(
    server: harness.ServerHandle,
) -> None:
    tokens = {name: server.token("alpha", subject=name) for name in ("alice", "bob")}
    headers = {name: {"Authorization": f"Bearer {token}"} for name, token in tokens.items()}
    async with (
        httpx.AsyncClient(base_url=server.url, headers=headers["alice"], timeout=TIMEOUT) as alice,
        httpx.AsyncClient(base_url=server.url, headers=headers["bob"], timeout=TIMEOUT) as bob,
        ThreadlineClient(server.url, tokens["alice"]) as alice_sdk,
        ThreadlineClient(server.url, tokens["bob"]) as bob_sdk,
    ):
        created = await alice.post("/v1/threads", json={"title": "deltas"})
        thread_id = created.json()["thread"]["id"]
        path = f"/v1/threads/{thread_id}"
        async with (
            alice_sdk.watch(thread_id) as alice_watch,
            bob_sdk.watch(thread_id) as bob_watch,
            raw_watch(server, tokens["bob"], thread_id) as bob_raw,
        ):
            watches = [(alice_watch, alice), (bob_watch, bob)]
            for watch, http in watches:
                await converged(watch, http, thread_id)

            async def settle() -> list[int]:
                return [await converged(w, h, thread_id) for w, h in watches]

            async def send(text: str) -> str:
                sent = await alice.post(f"{path}/messages", json={"text": text})
                assert sent.status_code == 202, sent.text
                return str(sent.json()["message_id"])

            fetches = [w.fetches for w, _ in watches]
            assert (await alice.patch(path, json={"title": "renamed"})).status_code == 200
            await settle()
            # One version behind: applied, no refetch.
            assert [w.fetches for w, _ in watches] == fetches
            assert all(w.deltas_applied >= 1 for w, _ in watches)

            patched = await alice.patch(f"{path}/metadata", json={"metadata": {"k": "v"}})
            assert patched.status_code == 200
            await settle()
            secret = await send(HIDDEN_TEXT)  # a tool call, its result, then the answer
            await settle()
            await send("weather in Lisbon?")
            await settle()
            bob_before_hide = len(bob_raw.frames)
            hidden = await alice.post(
                f"{path}/messages/{secret}/visibility", json={"visibility": "hidden"}
            )
            assert hidden.status_code == 200, hidden.text
            await settle()
            after_hide = bob_raw.frames[bob_before_hide:]
            assert after_hide and all(HIDDEN_TEXT.encode() not in normal(f) for f in after_hide)
            assert all(secret not in normal(w._wire).decode() for w, _ in watches)
            shown = await alice.post(
                f"{path}/messages/{secret}/visibility", json={"visibility": "visible"}
            )
            assert shown.status_code == 200, shown.text
            await settle()
            regenerated = await alice.post(f"{path}/regenerate", json={})
            assert regenerated.status_code == 202, regenerated.text
            await settle()
            await send("please email bob@example.com the minutes")  # an approval waits
            versions = await settle()

            alice_messages = {
                m["id"] for m in (await alice.get(path)).json()["messages"] if m["role"] == "user"
            }
            # Bob's deltas carry bob's permissions: never alice's messages to hide.
            for frame in bob_raw.frames:
                permissions = frame.get("delta", {}).get("set", {}).get("permissions")
                if permissions is not None:
                    assert not alice_messages & set(permissions["visibility"]), frame
            alice_view = (await alice.get(path)).json()["permissions"]["visibility"]
            assert alice_messages <= set(alice_view)  # the case the check above guards

            deltas = [f for f in bob_raw.frames if "delta" in f]
            assert len(deltas) >= 10, [f.get("version") for f in bob_raw.frames]
            applied = [w.deltas_applied for w, _ in watches]
            fetched = [w.fetches for w, _ in watches]
            # Most commits were applied from their delta, not refetched.
            assert all(a > 2 * f for a, f in zip(applied, fetched, strict=True)), (
                applied,
                fetched,
                versions,
            )


async def test_without_deltas_nothing_changes(server: harness.ServerHandle) -> None:
    """A subscription that does not ask for deltas gets the plain invalidation, as before."""
    token = server.token("alpha", subject="carol")
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=TIMEOUT) as http:
        thread_id = (await http.post("/v1/threads", json={"title": "plain"})).json()["thread"]["id"]
        async with connect(f"{server.ws_url}?token={token}", open_timeout=TIMEOUT) as ws:
            await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id}).decode())
            while orjson.loads(await ws.recv())["type"] != "subscribed":
                pass
            await http.get(f"/v1/threads/{thread_id}")
            renamed = await http.patch(f"/v1/threads/{thread_id}", json={"title": "r"})
            async with asyncio.timeout(TIMEOUT):
                while True:
                    frame = orjson.loads(await ws.recv())
                    if frame["type"] == "invalidate":
                        break
            assert frame == {
                "type": "invalidate",
                "thread_id": thread_id,
                "version": renamed.json()["version"],
            }
