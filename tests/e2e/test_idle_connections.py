"""Idle, slow and too many connections against a real server, over raw asyncio streams."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import websockets
from websockets.typing import Subprotocol

from tests.e2e import harness

HEADER_TIMEOUT = 1.0  # THREADLINE_HTTP_HEADER_TIMEOUT
KEEP_ALIVE = 1.0  # THREADLINE_HTTP_KEEP_ALIVE_TIMEOUT
BODY_TIMEOUT = 3.0  # THREADLINE_HTTP_BODY_TIMEOUT (above the pipelined test's 2 s body)
MAX_CONNECTIONS = 6  # THREADLINE_MAX_CONNECTIONS
SLACK = 3.0  # a loaded 2-core machine may run the server's timers late
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory: Path = tmp_path_factory.mktemp("bounded")
    env = harness.server_env(harness.sqlite_url(directory))
    env.update(
        {
            "THREADLINE_HTTP_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "THREADLINE_HTTP_KEEP_ALIVE_TIMEOUT": str(KEEP_ALIVE),
            "THREADLINE_HTTP_BODY_TIMEOUT": str(BODY_TIMEOUT),
            "THREADLINE_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        }
    )
    handle = harness.start("all", env=env, log_dir=directory)
    try:
        yield handle
    finally:
        handle.stop()


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the server sends until it closes; TimeoutError if it is still open."""
    received = b""
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            received += chunk
    return received


async def test_a_silent_connection_is_closed_at_the_header_deadline(
    bounded: harness.ServerHandle,
) -> None:
    async with connection(bounded.port) as (reader, _writer):
        started = time.monotonic()
        assert await until_closed(reader, HEADER_TIMEOUT + SLACK) == b""
        assert time.monotonic() - started >= HEADER_TIMEOUT * 0.9


async def test_a_slowloris_connection_is_closed_while_its_headers_trickle_in(
    bounded: harness.ServerHandle,
) -> None:
    async with connection(bounded.port) as (reader, writer):
        started = time.monotonic()

        async def trickle() -> None:
            # A byte every 50 ms: each one used to cancel uvicorn's only timer.
            for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                with contextlib.suppress(OSError):
                    await writer.drain()
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(trickle())
        try:
            assert await until_closed(reader, HEADER_TIMEOUT + SLACK) == b""
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender
        assert not sender.done() or sender.cancelled()  # still trickling when it was closed
        assert time.monotonic() - started >= HEADER_TIMEOUT * 0.9


async def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not(
    bounded: harness.ServerHandle,
) -> None:
    async with connection(bounded.port) as (reader, writer):
        # Requests in a row, each within the deadlines: the connection serves them all.
        for _ in range(3):
            writer.write(REQUEST)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await asyncio.wait_for(reader.readexactly(length), 10.0)
            await asyncio.sleep(KEEP_ALIVE / 3)
        assert await until_closed(reader, KEEP_ALIVE + SLACK) == b""


async def test_beyond_the_connection_limit_requests_and_upgrades_get_503(
    bounded: harness.ServerHandle,
) -> None:
    token = bounded.token("limits", subject="many")
    subprotocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{token}")]
    async with contextlib.AsyncExitStack() as stack:
        # Websockets hold their connections past the header deadline. The limit counts the
        # connection asking: with MAX_CONNECTIONS - 1 open, the next one is refused.
        sockets = [
            await stack.enter_async_context(
                websockets.connect(bounded.ws_url, subprotocols=subprotocols)
            )
            for _ in range(MAX_CONNECTIONS - 1)
        ]
        async with connection(bounded.port) as (reader, writer):
            writer.write(REQUEST)
            await writer.drain()
            answer = await until_closed(reader, 10.0)
            assert answer.startswith(b"HTTP/1.1 503"), answer
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(bounded.ws_url, subprotocols=subprotocols):
                pass
        assert refused.value.response.status_code == 503
        await sockets.pop().close()
        # One closed: the next request is served. (The server notices the close at once, but
        # a loaded machine may take a moment: retry briefly.)
        deadline = time.monotonic() + 10.0
        while True:
            async with connection(bounded.port) as (reader, writer):
                writer.write(REQUEST)
                await writer.drain()
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_a_pipelined_request_parsed_early_is_not_cut_by_the_header_deadline(
    bounded: harness.ServerHandle,
) -> None:
    token = bounded.token("limits", subject="piper")
    body = b'{"title": "pipelined"}'
    create = (
        b"POST /v1/threads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + token.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    async with connection(bounded.port) as (reader, writer):
        # The second request's headers arrive with the first: they are parsed while the first
        # is served, so when it completes no header deadline may be armed for the second,
        # whose body then takes longer than the deadline to come.
        writer.write(REQUEST + create + body[:1])
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await asyncio.wait_for(reader.readexactly(length), 10.0)
        for byte in body[1:]:
            await asyncio.sleep(2 * HEADER_TIMEOUT / len(body))
            writer.write(bytes([byte]))
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 201"), head


@pytest.mark.parametrize("where", ["url", "header", "many headers"])
async def test_a_request_head_over_the_bound_gets_431_and_a_close(
    bounded: harness.ServerHandle, where: str
) -> None:
    big = 17 * 1024  # over MAX_HEAD_BYTES (16 KiB)
    if where == "url":
        request = b"GET /healthz?pad=" + b"a" * big + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    elif where == "header":
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * big + b"\r\n\r\n"
    else:
        pads = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"a" * 100) for n in range(170))
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + pads + b"\r\n"
    async with connection(bounded.port) as (reader, writer):
        writer.write(request)
        with contextlib.suppress(OSError):  # it may close before reading all of it
            await writer.drain()
        answer = await until_closed(reader, 10.0)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    # A head just under the bound is served, and the server is still there.
    async with connection(bounded.port) as (reader, writer):
        pad = b"a" * (15 * 1024)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + pad + b"\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 200"), head


def post_head(token: str, length: int) -> bytes:
    return (
        b"POST /v1/threads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + token.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


async def test_a_slow_body_is_closed_at_the_body_deadline_and_logs_no_error(
    bounded: harness.ServerHandle,
) -> None:
    token = bounded.token("limits", subject="slow-body")
    async with connection(bounded.port) as (reader, writer):
        started = time.monotonic()
        writer.write(post_head(token, 100) + b'{"title": ')  # and nothing more
        await writer.drain()
        assert await until_closed(reader, BODY_TIMEOUT + SLACK) == b""
        assert time.monotonic() - started >= BODY_TIMEOUT * 0.9
    # A client that hangs up in the middle of its body: the same, at once.
    async with connection(bounded.port) as (reader, writer):
        writer.write(post_head(token, 100) + b'{"title": ')
        await writer.drain()
    await asyncio.sleep(0.5)
    # Neither is an unexpected error (a 500 with a stack trace), and the server still serves.
    async with connection(bounded.port) as (reader, writer):
        writer.write(REQUEST)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 200"), head
    log = bounded.log_path.read_text(errors="replace")
    assert "unexpected error" not in log, log[-2000:]
