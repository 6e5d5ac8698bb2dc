"""The websocket gateway against a real server: subscribe, stream, commands, bad frames, closes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from runtime.domain import MAX_TITLE_CHARS
from tests.e2e import harness
from tests.e2e.harness import ServerHandle

TIMEOUT = 10.0


class Client:
    """A websocket client that reads JSON frames with a bound on every wait."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any] | str | bytes) -> None:
        data = frame if isinstance(frame, str | bytes) else orjson.dumps(frame).decode()
        await self.ws.send(data)

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            return dict(orjson.loads(await self.ws.recv()))

    async def recv_until(self, predicate: Any, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Frames up to and including the first matching `predicate`."""
        frames = []
        async with asyncio.timeout(timeout):
            while True:
                frame = dict(orjson.loads(await self.ws.recv()))
                frames.append(frame)
                if predicate(frame):
                    return frames

    async def answer(self, frame_id: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The answer to the frame with `frame_id`, skipping live frames."""
        frames = await self.recv_until(lambda f: f.get("id") == frame_id, timeout)
        return frames[-1]


async def open_client(server: ServerHandle, token: str | None) -> ClientConnection:
    url = server.ws_url if token is None else f"{server.ws_url}?token={token}"
    return await connect(url, open_timeout=TIMEOUT, close_timeout=2, max_size=2**22)


@pytest.fixture
async def ws(server: ServerHandle, tokens: dict[str, str]) -> AsyncIterator[Client]:
    connection = await open_client(server, tokens["alice"])
    try:
        yield Client(connection)
    finally:
        await connection.close()


async def http(server: ServerHandle, token: str, method: str, path: str, **kw: Any) -> Any:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT
    ) as client:
        response = await client.request(method, path, **kw)
        assert response.status_code < 300, response.text
        return response.json()


async def new_thread(server: ServerHandle, token: str) -> str:
    return str((await http(server, token, "POST", "/v1/threads", json={}))["thread"]["id"])


async def wait_run(
    server: ServerHandle, token: str, thread_id: str, status: str = "completed"
) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        snapshot: dict[str, Any] = await http(server, token, "GET", f"/v1/threads/{thread_id}")
        if snapshot["run"] and snapshot["run"]["status"] == status:
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"run of {thread_id} never became {status}")


def chunk_seqs(frames: list[dict[str, Any]], run_id: str) -> list[int]:
    return [f["seq"] for f in frames if f["type"] == "chunk" and f["run_id"] == run_id]


async def test_subscribe_send_and_stream(ws: Client, server: ServerHandle, tokens: Any) -> None:
    thread_id = await new_thread(server, tokens["alice"])
    await ws.send({"type": "subscribe", "thread_id": thread_id, "id": "s1"})
    subscribed = await ws.recv()
    assert subscribed == {"type": "subscribed", "thread_id": thread_id, "version": 1, "id": "s1"}
    await ws.send({"type": "message.send", "thread_id": thread_id, "text": "hello stream", "id": 2})
    frames = await ws.recv_until(
        lambda f: f["type"] == "chunk" and f["chunk"]["type"] == "step-finish"
    )
    ack = next(f for f in frames if f["type"] == "ack")
    assert ack["id"] == 2 and ack["thread_id"] == thread_id and ack["run_id"]
    run_id = ack["run_id"]
    seqs = chunk_seqs(frames, run_id)
    assert seqs == list(range(len(seqs))) and seqs[0] == 0
    text = "".join(
        f["chunk"]["delta"]
        for f in frames
        if f["type"] == "chunk" and f["chunk"]["type"] == "text-delta"
    )
    assert "hello stream" in text
    snapshot = await wait_run(server, tokens["alice"], thread_id)
    final = snapshot["thread"]["version"]
    frames += await ws.recv_until(lambda f: f["type"] == "invalidate" and f["version"] == final)
    versions = [f["version"] for f in frames if f["type"] == "invalidate"]
    assert versions == sorted(set(versions)) and versions[-1] == final
    assert snapshot["run"]["next_seq"] >= len(seqs)


async def test_many_threads_on_one_connection(
    ws: Client, server: ServerHandle, tokens: Any
) -> None:
    threads = [await new_thread(server, tokens["alice"]) for _ in range(3)]
    for index, thread_id in enumerate(threads):
        await ws.send({"type": "subscribe", "thread_id": thread_id, "id": index})
        assert (await ws.answer(index))["type"] == "subscribed"
    for thread_id in threads:
        await http(
            server,
            tokens["alice"],
            "POST",
            f"/v1/threads/{thread_id}/messages",
            json={"text": f"hi {thread_id}"},
        )
    seen: set[str] = set()
    async with asyncio.timeout(TIMEOUT):
        while seen != set(threads):
            frame = await ws.recv()
            if frame["type"] == "chunk" and frame["chunk"]["type"] == "step-finish":
                seen.add(frame["thread_id"])


async def test_bad_frames_get_errors_and_connection_stays_open(ws: Client) -> None:
    await ws.send("this is not json")
    assert (await ws.recv())["code"] == "invalid_json"
    await ws.send("[1, 2, 3]")
    assert (await ws.recv())["code"] == "invalid_frame"
    await ws.send({"type": "warp.drive", "id": "w"})
    error = await ws.recv()
    assert (error["type"], error["code"], error["id"]) == ("error", "unknown_type", "w")
    await ws.send({"type": "subscribe", "id": 11})
    error = await ws.recv()
    assert (error["code"], error["id"]) == ("invalid_input", 11)
    assert error["errors"][0]["loc"] == ["thread_id"]
    await ws.send(b'{"type": "ping", "id": "bin"}')
    assert await ws.recv() == {"type": "pong", "id": "bin"}


async def test_foreign_scope_subscribe_is_not_found(
    ws: Client, server: ServerHandle, tokens: Any
) -> None:
    foreign = await new_thread(server, tokens["carol"])
    await ws.send({"type": "subscribe", "thread_id": foreign, "id": 1})
    error = await ws.recv()
    assert (error["type"], error["code"], error["id"]) == ("error", "not_found", 1)
    await ws.send({"type": "subscribe", "thread_id": "th_does_not_exist", "id": 2})
    assert (await ws.recv())["code"] == "not_found"
    await ws.send({"type": "message.send", "thread_id": foreign, "text": "hi", "id": 3})
    assert (await ws.recv())["code"] == "not_found"


async def test_commands_match_http(ws: Client, server: ServerHandle, tokens: Any) -> None:
    thread_id = await new_thread(server, tokens["alice"])
    await ws.send(
        {
            "type": "message.send",
            "thread_id": thread_id,
            "text": "email bob@example.com hi",
            "client_request_id": "c1",
            "id": "m",
        }
    )
    ack = await ws.answer("m")
    assert ack["type"] == "ack" and ack["run_id"]
    again = {
        "type": "message.send",
        "thread_id": thread_id,
        "text": "x",
        "client_request_id": "c1",
        "id": "m2",
    }
    await ws.send(again)
    assert (await ws.answer("m2"))["run_id"] == ack["run_id"]
    snapshot = await wait_run(server, tokens["alice"], thread_id, "waiting")
    action_id = snapshot["pending_actions"][0]["id"]
    resume = {"type": "action.resume", "thread_id": thread_id, "action_id": action_id}
    await ws.send({**resume, "payload": {"approved": "yes"}, "id": "bad"})
    invalid = await ws.answer("bad")
    assert invalid["code"] == "invalid_payload" and invalid["errors"]
    await ws.send({**resume, "payload": {"approved": False}, "id": "ok"})
    assert (await ws.answer("ok"))["type"] == "ack"
    await ws.send({**resume, "payload": {"approved": True}, "id": "late"})
    late = await ws.answer("late")
    assert late["code"] == "conflict" and "alice" in str(late)
    manual = {
        "type": "action.manual_result",
        "thread_id": thread_id,
        "action_id": action_id,
        "output": 1,
        "id": "man",
    }
    await ws.send(manual)
    assert (await ws.answer("man"))["code"] == "forbidden"


async def test_closing_a_socket_never_stops_a_run(server: ServerHandle, tokens: Any) -> None:
    thread_id = await new_thread(server, tokens["alice"])
    connection = await open_client(server, tokens["alice"])
    client = Client(connection)
    await client.send({"type": "message.send", "thread_id": thread_id, "text": "bye", "id": 1})
    assert (await client.answer(1))["type"] == "ack"
    await connection.close()
    snapshot = await wait_run(server, tokens["alice"], thread_id)
    assert snapshot["messages"][-1]["role"] == "assistant"


@pytest.mark.parametrize("token", [None, "tl_wrong", "nonsense"])
async def test_bad_token_closes_4401(server: ServerHandle, token: str | None) -> None:
    connection = await open_client(server, token)
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(TIMEOUT):
            await connection.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 4401


async def test_oversize_frame_closes_1009(server: ServerHandle, tokens: Any) -> None:
    connection = await open_client(server, tokens["alice"])
    await connection.send(orjson.dumps({"type": "ping", "pad": "x" * 70_000}).decode())
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(TIMEOUT):
            while True:
                await connection.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


# --- late joiners (a server whose demo agent streams slowly) ---------------------------


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    directory = tmp_path_factory.mktemp("slow")
    env = harness.server_env(harness.sqlite_url(directory), {"THREADLINE_DEMO_DELAY_MS": "40"})
    handle = harness.start("all", env, log_dir=directory)
    try:
        yield handle
    finally:
        handle.stop()


async def test_late_joiner_gets_the_stream_from_its_first_chunk(slow_server: ServerHandle) -> None:
    token = slow_server.token("late", "user", "late")
    thread_id = await new_thread(slow_server, token)
    text = " ".join(f"word{i}" for i in range(30))
    sent = await http(
        slow_server, token, "POST", f"/v1/threads/{thread_id}/messages", json={"text": text}
    )
    await asyncio.sleep(0.5)  # several chunks are out before this client joins
    connection = await open_client(slow_server, token)
    client = Client(connection)
    try:
        await client.send({"type": "subscribe", "thread_id": thread_id, "id": "late"})
        frames = await client.recv_until(
            lambda f: f["type"] == "chunk" and f["chunk"]["type"] == "step-finish", 30
        )
    finally:
        await connection.close()
    assert frames[0]["type"] == "subscribed"
    seqs = chunk_seqs(frames, sent["run_id"])
    assert seqs[0] == 0 and seqs == list(range(len(seqs))), seqs
    deltas = "".join(
        f["chunk"]["delta"]
        for f in frames
        if f["type"] == "chunk" and f["chunk"]["type"] == "text-delta"
    )
    assert "word0" in deltas and "word29" in deltas


async def test_rename_over_http_and_websocket_is_a_version_watchers_see(
    ws: Client, server: ServerHandle, tokens: Any
) -> None:
    """`thread.rename`, a route and a frame from one table row: each rename is a version the
    thread's watchers are told about; a bad title or a foreign thread changes nothing."""
    thread_id = await new_thread(server, tokens["alice"])
    path = f"/v1/threads/{thread_id}"
    await ws.send({"type": "subscribe", "thread_id": thread_id, "id": "s"})
    assert (await ws.answer("s"))["version"] == 1
    # Another user of the scope may rename it, as they may create threads in it.
    renamed = await http(server, tokens["bob"], "PATCH", path, json={"title": "Lisbon"})
    assert renamed == {"thread_id": thread_id, "version": 2}
    await ws.recv_until(lambda f: f["type"] == "invalidate" and f["version"] == 2)
    await ws.send({"type": "thread.rename", "thread_id": thread_id, "title": "Porto", "id": "r"})
    assert await ws.answer("r") == {"type": "ack", "id": "r", "thread_id": thread_id, "version": 3}
    await ws.recv_until(lambda f: f["type"] == "invalidate" and f["version"] == 3)
    snapshot = await http(server, tokens["alice"], "GET", path)
    assert (snapshot["thread"]["title"], snapshot["thread"]["version"]) == ("Porto", 3)
    listed = await http(server, tokens["alice"], "GET", "/v1/threads")
    assert {"id": thread_id, "title": "Porto"}.items() <= next(
        t for t in listed["threads"] if t["id"] == thread_id
    ).items()

    refused = [
        ("alice", {"title": "x" * (MAX_TITLE_CHARS + 1)}, 413, "too_large"),
        ("alice", {"title": 5}, 422, "invalid_input"),
        ("alice", {}, 422, "invalid_input"),
        ("alice", {"title": "ok", "colour": "red"}, 422, "invalid_input"),
        ("alice", {"title": "nul\x00"}, 422, "invalid_input"),
        ("carol", {"title": "mine now"}, 404, "not_found"),  # another scope: no such thread
    ]
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
        for who, body, status, code in refused:
            headers = {"Authorization": f"Bearer {tokens[who]}"}
            response = await client.patch(path, json=body, headers=headers)
            assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    await ws.send(
        {
            "type": "thread.rename",
            "thread_id": thread_id,
            "title": "x" * (MAX_TITLE_CHARS + 1),
            "id": "big",
        }
    )
    assert (await ws.answer("big"))["code"] == "too_large"
    unchanged = await http(server, tokens["alice"], "GET", path)
    assert (unchanged["thread"]["title"], unchanged["thread"]["version"]) == ("Porto", 3)
