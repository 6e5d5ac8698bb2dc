"""No token reaches any line a server prints, in any encoding, access log included."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import quote, unquote_plus

import httpx
import websockets
from websockets.typing import Subprotocol

from tests.e2e import harness
from threadline_client import ThreadlineClient

# `threadline serve` prints the development token in the browser URL it tells the operator
# to open (PROTOCOL.md): that one line, on stdout, is where it is meant to be.
STARTUP = re.compile(r"^Threadline is starting\. Open http://\S+/#token=tl_[A-Za-z0-9_-]+$")
ANY_TOKEN = re.compile(r"tl_[A-Za-z0-9_-]{16,}")


def fully_decoded(text: str) -> str:
    for _ in range(6):
        text = unquote_plus(text)
    return text


def escaped(text: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in text)


async def close_code(url: str, **kwargs: object) -> int | None:
    """Open a websocket, subscribe to nothing, and return how it ended (None: still open)."""
    try:
        async with websockets.connect(url, **kwargs) as ws:  # type: ignore[arg-type]
            await ws.send('{"type": "ping", "id": "p"}')
            await asyncio.wait_for(ws.recv(), 10.0)
            return None
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None


async def test_no_token_in_any_log_line(tmp_path: Path) -> None:
    env = harness.server_env(harness.sqlite_url(tmp_path), {"THREADLINE_LOG_LEVEL": "info"})
    server = harness.start("all", env=env, log_dir=tmp_path)
    try:
        printed = [line for line in server.log().splitlines() if STARTUP.match(line)]
        assert len(printed) == 1, server.log()[-2000:]
        dev = printed[0].rsplit("#token=", 1)[1]
        user = server.token("logs", subject="user")
        unknown = "tl_" + "x" * 43  # well-formed, not minted: refused, and still a secret
        tokens = [dev, user, unknown]
        base, ws = server.url, server.ws_url

        async with httpx.AsyncClient(base_url=base, timeout=10.0) as http:
            # The browser's page, with a token where older servers printed it.
            assert (await http.get(f"/?token={dev}")).status_code == 200
            headers = {"Authorization": f"Bearer {user}"}
            assert (await http.get("/v1/threads", headers=headers)).status_code == 200
            for query in (
                f"token={user}",
                f"TOKEN={user}",
                f"%74oken={user}",
                f"tok%2565n={user}",  # percent-encoded twice
                f"token={escaped(user)}",
                f"a=1&token={user}&token={dev}",
                f"token={quote(unknown)}",
            ):
                await http.get(f"/v1/threads?{query}")
                await http.get(f"/no/such/route?{query}")

        # Websockets the old way, in every encoding; a bad token closes with 4401.
        assert await close_code(f"{ws}?token={user}") is None
        assert await close_code(f"{ws}?%74oken={user}") is None
        assert await close_code(f"{ws}?token={escaped(dev)}") is None
        assert await close_code(f"{ws}?ToKeN={user}") == 4401  # not a key the server reads
        assert await close_code(f"{ws}?x=1;token={user}&token={user}") is None
        assert await close_code(f"{ws}?token={unknown}") == 4401
        # The new way: the bearer subprotocol (what the browser and Python clients send).
        protocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{user}")]
        assert await close_code(ws, subprotocols=protocols) is None
        bad = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{unknown}")]
        assert await close_code(ws, subprotocols=bad) == 4401
        # The Python client's watch: a websocket with no token in its URL.
        async with ThreadlineClient(base, user) as client:
            created = await client.create_thread("logs")
            await client.send(created.thread.id, "hello")
            async with client.watch(created.thread.id) as watch:
                await watch.until(lambda w: w.snapshot is not None and w.connections > 0, 15.0)
    finally:
        server.stop()

    lines = server.log().splitlines()
    # The access log was on: the scan covered request lines with their query strings.
    assert any('"WebSocket /v1/ws?%74oken=[redacted]"' in line for line in lines), lines[-20:]
    assert any("GET /v1/threads?a=1&token=[redacted]&token=[redacted]" in line for line in lines)
    leaks = []
    for line in lines:
        if STARTUP.match(line):
            continue
        decoded = fully_decoded(line)
        if any(token in decoded for token in tokens) or ANY_TOKEN.search(decoded):
            leaks.append(line)
    assert not leaks, "\n".join(leaks[:20])
