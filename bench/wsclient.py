"""A lean websocket client for the fan-out benchmarks: thousands of connections, one process.

A plain asyncio Protocol per connection (no task, no per-frame coroutine): the handshake, then
server frames parsed straight from the receive buffer, so reading a delivery costs a few
microseconds and the client is not the bottleneck it would be with a full client library.

Every delivery is a text frame whose payload holds `t=<time.monotonic_ns() at publish>`; the
client counts deliveries and records publish -> receipt latency from that stamp (one clock:
CLOCK_MONOTONIC is system-wide). `deflate=True` offers permessage-deflate as browsers do; a
compressed frame is inflated before its stamp is read.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
import zlib
from dataclasses import dataclass, field

STAMP = b"t="
_TAIL = b"\x00\x00\xff\xff"


@dataclass
class Tally:
    """Deliveries and latencies (ns) of every connection of a run, reset per measured step."""

    deliveries: int = 0
    latencies: list[int] = field(default_factory=list)
    expected: int = -1  # all_in is set when deliveries reach it
    pings: int = 0  # keepalive pings the server sent (each answered with a pong)
    all_in: asyncio.Event = field(default_factory=asyncio.Event)

    def reset(self, expect: int = -1) -> None:
        self.deliveries = 0
        self.latencies = []
        self.expected = expect
        self.all_in.clear()


class Client(asyncio.Protocol):
    def __init__(self, tally: Tally, path: str, host: str, deflate: bool) -> None:
        self.tally = tally
        self.path = path
        self.host = host
        self.deflate = deflate
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.open = False
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.inflater: zlib._Decompress | None = None
        self.fresh_inflater = False  # server_no_context_takeover: a new context per message

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {self.path} HTTP/1.1",
            f"Host: {self.host}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if self.deflate:
            lines.append("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.subscribed, self.closed):
            if not future.done():
                future.set_result(None) if future is self.closed else future.set_exception(
                    ConnectionError("connection lost")
                )

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.open:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self._handshake(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
        self._frames()

    def _handshake(self, head: bytes) -> None:
        status, *headers = head.decode("latin-1").split("\r\n")
        if " 101 " not in status + " ":
            self.opened.set_exception(ConnectionError(f"handshake refused: {status}"))
            assert self.transport is not None
            self.transport.close()
            return
        for line in headers:
            name, _, value = line.partition(":")
            if name.strip().lower() == "sec-websocket-extensions" and "deflate" in value:
                self.inflater = zlib.decompressobj(-15)
                self.fresh_inflater = "server_no_context_takeover" in value
        self.open = True
        self.opened.set_result(None)

    # -- frames --------------------------------------------------------------------------

    def _frames(self) -> None:
        buffer = self.buffer
        start = 0
        size = len(buffer)
        while size - start >= 2:
            first, second = buffer[start], buffer[start + 1]
            length = second & 0x7F
            head = 2
            if length == 126:
                if size - start < 4:
                    break
                length = struct.unpack_from("!H", buffer, start + 2)[0]
                head = 4
            elif length == 127:
                if size - start < 10:
                    break
                length = struct.unpack_from("!Q", buffer, start + 2)[0]
                head = 10
            if size - start < head + length:
                break
            payload = bytes(buffer[start + head : start + head + length])
            start += head + length
            self._frame(first, payload)
        if start:
            del buffer[:start]

    def _frame(self, first: int, payload: bytes) -> None:
        opcode = first & 0x0F
        if opcode in (1, 2):
            if first & 0x40 and self.inflater is not None:
                if self.fresh_inflater:
                    self.inflater = zlib.decompressobj(-15)
                payload = self.inflater.decompress(payload + _TAIL)
            at = payload.find(STAMP)
            if at >= 0:
                tally = self.tally
                tally.deliveries += 1
                end = payload.find(b'"', at)
                tally.latencies.append(time.monotonic_ns() - int(payload[at + 2 : end]))
                if tally.deliveries == tally.expected:
                    tally.all_in.set()
            elif not self.subscribed.done() and b'"subscribed"' in payload:
                self.subscribed.set_result(None)
        elif opcode == 9:  # ping: answer with a pong carrying the same payload
            self.tally.pings += 1
            self.send(payload, opcode=10)
        elif opcode == 8 and self.transport is not None:
            self.transport.close()

    def send(self, payload: bytes, opcode: int = 1) -> None:
        """One masked frame (clients must mask)."""
        assert self.transport is not None and len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


async def connect(
    host: str,
    port: int,
    path: str,
    tally: Tally,
    *,
    subscribe: bytes,
    deflate: bool = False,
    timeout: float = 60.0,
) -> Client:
    """An open connection that sent `subscribe` and got a `subscribed` frame back."""
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(
        lambda: Client(tally, path, f"{host}:{port}", deflate), host, port
    )
    try:
        async with asyncio.timeout(timeout):
            await client.opened
            client.send(subscribe)
            await client.subscribed
    except BaseException:
        client.close()
        raise
    return client


async def connect_many(
    count: int,
    host: str,
    port: int,
    path: str,
    tally: Tally,
    *,
    subscribe: bytes,
    deflate: bool = False,
    concurrency: int = 100,
) -> list[Client]:
    gate = asyncio.Semaphore(concurrency)
    clients: list[Client] = []

    async def one() -> None:
        async with gate:
            clients.append(
                await connect(host, port, path, tally, subscribe=subscribe, deflate=deflate)
            )

    try:
        await asyncio.gather(*(one() for _ in range(count)))
    except BaseException:
        close_all(clients)
        raise
    return clients


def close_all(clients: list[Client]) -> None:
    for client in clients:
        client.close()
