"""A websocket client that stops reading is dropped at the TCP level, and its slot is freed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import websockets
from websockets.typing import Subprotocol

from tests.e2e import harness
from tests.e2e.rawsockets import (
    client_frame,
    close_code_in,
    closed_by_peer,
    open_unread_websocket,
    read_to_end,
    server_holds,
)

OUTBOX_BYTES = 4096
GRACE = 1.0  # THREADLINE_WS_SLOW_CONSUMER_GRACE
CLOSE_GRACE = 1.0  # THREADLINE_WS_CLOSE_GRACE
WATCHDOG = 1.0  # the gateway checks paused outboxes this often (gateway._OUTBOX_CHECK_INTERVAL)
# The documented bound, plus room for a loaded 2-core machine to schedule the timers.
BOUND = GRACE + WATCHDOG + CLOSE_GRACE + 3.0
TEXT = "slow consumer " * 4600  # ~64 KB: one reply streams ~64 KB of chunks
MAX_MESSAGES = 120  # a bound on the load loop: far more than any kernel buffers hold


def start_server(directory: Path, close_grace: float) -> harness.ServerHandle:
    env = harness.server_env(harness.sqlite_url(directory))
    env.update(
        {
            "THREADLINE_WS_OUTBOX_MAX_BYTES": str(OUTBOX_BYTES),
            "THREADLINE_WS_SLOW_CONSUMER_GRACE": str(GRACE),
            "THREADLINE_WS_CLOSE_GRACE": str(close_grace),
            # One websocket per token: a new one opens only once the dropped one's slot is free.
            "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1",
            "THREADLINE_TOKEN_RATE": "1000",
            "THREADLINE_TOKEN_BURST": "1000",
        }
    )
    return harness.start("all", env=env, log_dir=directory)


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    with start_server(tmp_path_factory.mktemp("slow"), CLOSE_GRACE) as handle:
        yield handle


def stream_reply(http: httpx.Client, thread_id: str) -> None:
    """Send a long message and wait until its run completes (its reply is all published)."""
    response = http.post(f"/v1/threads/{thread_id}/messages", json={"text": TEXT})
    assert response.status_code == 202, response.text
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        run = http.get(f"/v1/threads/{thread_id}").json()["run"]
        if run and run["status"] == "completed":
            return
        time.sleep(0.02)
    raise AssertionError(f"the run of {thread_id} did not complete")


def test_a_consumer_that_stops_reading_is_aborted_and_its_token_can_reconnect(
    slow_server: harness.ServerHandle,
) -> None:
    token = slow_server.token("slow", subject="reader")
    http = httpx.Client(
        base_url=slow_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0
    )
    thread_id = http.post("/v1/threads", json={}).json()["thread"]["id"]
    sock = open_unread_websocket(slow_server.port, ["threadline.v1", f"bearer.{token}"])
    client_port = sock.getsockname()[1]
    sock.sendall(client_frame({"type": "subscribe", "thread_id": thread_id, "id": "s"}))
    pid = slow_server.process.pid
    assert server_holds(pid, slow_server.port, client_port)

    # Stream to the thread (and keep sending frames) without ever reading, until the server
    # lets go of the socket. Each reply is published in full before its run completes.
    sent = 0
    last_published = time.monotonic()
    dropped_at: float | None = None
    while sent < MAX_MESSAGES:
        sent += 1
        stream_reply(http, thread_id)
        last_published = time.monotonic()
        try:
            sock.sendall(client_frame({"type": "ping"}))
        except OSError:
            dropped_at = time.monotonic()  # reset by the server
            break
        if not server_holds(pid, slow_server.port, client_port):
            dropped_at = time.monotonic()
            break
    if dropped_at is None:  # everything is published: the drop is due within the bound
        deadline = last_published + BOUND + 5.0
        while time.monotonic() < deadline and server_holds(pid, slow_server.port, client_port):
            time.sleep(0.05)
        if not server_holds(pid, slow_server.port, client_port):
            dropped_at = time.monotonic()
    assert dropped_at is not None, f"still open after {sent} replies\n{slow_server.log()[-3000:]}"
    print(f"dropped after {sent} replies, {dropped_at - last_published:.2f} s after the last")
    assert dropped_at - last_published <= BOUND, (dropped_at - last_published, sent)
    # At the TCP level from the client's side too: a reset or FIN, not a socket held open.
    assert closed_by_peer(sock, timeout=5.0)
    sock.close()

    # The dropped connection's slot (one per token here) is free: the token opens a new one.
    async def reconnect() -> dict[str, object]:
        subprotocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{token}")]
        async with websockets.connect(slow_server.ws_url, subprotocols=subprotocols) as ws:
            assert ws.subprotocol == "threadline.v1"
            await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": "a"}))
            return dict(orjson.loads(await ws.recv()))

    answer = asyncio.run(reconnect())
    assert answer["type"] == "subscribed", answer
    http.close()


async def opens(url: str, token: str) -> bool:
    """Whether a websocket of `token` opens and stays open (not closed with 4429)."""
    subprotocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{token}")]
    try:
        async with websockets.connect(url, subprotocols=subprotocols) as ws:
            await ws.send(orjson.dumps({"type": "ping", "id": "p"}).decode())
            return bool(orjson.loads(await asyncio.wait_for(ws.recv(), 10.0))["type"] == "pong")
    except websockets.ConnectionClosed:
        return False


def test_a_consumer_that_reads_again_within_the_close_grace_gets_4408(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The slot is freed when the gateway gives up; the close frame waits behind the frames
    the socket holds, and a client that reads again before the (long) close grace ends gets
    it: 4408, the documented code."""
    with start_server(tmp_path_factory.mktemp("grace"), close_grace=60.0) as server:
        token = server.token("slow", subject="reader")
        http = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0
        )
        thread_id = http.post("/v1/threads", json={}).json()["thread"]["id"]
        sock = open_unread_websocket(server.port, ["threadline.v1", f"bearer.{token}"])
        sock.sendall(client_frame({"type": "subscribe", "thread_id": thread_id, "id": "s"}))
        # The token may hold one websocket: another opens once the gateway gave this one up.
        given_up = False
        for _ in range(MAX_MESSAGES):
            stream_reply(http, thread_id)
            if asyncio.run(opens(server.ws_url, token)):
                given_up = True
                break
        assert given_up, "the gateway never gave up the consumer that stopped reading"
        assert server_holds(server.process.pid, server.port, sock.getsockname()[1])
        # Reading again, well within the close grace: the frames it held, then the close.
        assert close_code_in(read_to_end(sock, timeout=30.0)) == 4408
        sock.close()
        http.close()
