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
from tests.e2e.rawsockets import client_frame, closed_by_peer, open_unread_websocket, server_holds

OUTBOX_BYTES = 4096
GRACE = 1.0  # THREADLINE_WS_SLOW_CONSUMER_GRACE
CLOSE_GRACE = 1.0  # THREADLINE_WS_CLOSE_GRACE
WATCHDOG = 1.0  # the gateway checks paused outboxes this often (gateway._OUTBOX_CHECK_INTERVAL)
# The documented bound, plus room for a loaded 2-core machine to schedule the timers.
BOUND = GRACE + WATCHDOG + CLOSE_GRACE + 3.0
TEXT = "slow consumer " * 4600  # ~64 KB: one reply streams ~64 KB of chunks
MAX_MESSAGES = 120  # a bound on the load loop: far more than any kernel buffers hold


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory: Path = tmp_path_factory.mktemp("slow")
    env = harness.server_env(harness.sqlite_url(directory))
    env.update(
        {
            "THREADLINE_WS_OUTBOX_MAX_BYTES": str(OUTBOX_BYTES),
            "THREADLINE_WS_SLOW_CONSUMER_GRACE": str(GRACE),
            "THREADLINE_WS_CLOSE_GRACE": str(CLOSE_GRACE),
            # One websocket per token: a new one opens only once the dropped one's slot is free.
            "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1",
            "THREADLINE_TOKEN_RATE": "1000",
            "THREADLINE_TOKEN_BURST": "1000",
        }
    )
    handle = harness.start("all", env=env, log_dir=directory)
    try:
        yield handle
    finally:
        handle.stop()


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
        response = http.post(f"/v1/threads/{thread_id}/messages", json={"text": TEXT})
        assert response.status_code == 202, response.text
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            run = http.get(f"/v1/threads/{thread_id}").json()["run"]
            if run and run["status"] == "completed":
                break
            time.sleep(0.02)
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
