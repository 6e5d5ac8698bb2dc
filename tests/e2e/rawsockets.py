"""Raw TCP clients for e2e tests: a websocket that never reads, and whether the server still
holds a connection."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import struct
import time

import orjson
import psutil


def client_frame(payload: dict[str, object]) -> bytes:
    """A masked client text frame carrying `payload` as JSON (RFC 6455 section 5.2)."""
    data = orjson.dumps(payload)
    mask = os.urandom(4)
    size = len(data)
    if size < 126:
        head = bytes((0x81, 0x80 | size))
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return head + mask + masked


def open_unread_websocket(
    port: int, subprotocols: list[str], *, receive_buffer: int = 4096, timeout: float = 10.0
) -> socket.socket:
    """A websocket to /v1/ws on loopback with a small receive buffer; reads only the handshake
    answer (byte by byte, so no frame after it is consumed)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Before connect: the window the peer is offered is fixed by the buffer at the handshake.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /v1/ws HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}\r\n\r\n"
    )
    sock.sendall(request.encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError(f"closed during the handshake: {answer!r}")
        answer += byte
    if not answer.startswith(b"HTTP/1.1 101"):
        sock.close()
        raise ConnectionError(f"upgrade refused: {answer!r}")
    return sock


def close_code_in(data: bytes) -> int | None:
    """The code of the close frame among the server frames `data` holds (None: none there)."""
    at = 0
    while at + 2 <= len(data):
        opcode, size = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if size == 126:
            (size,) = struct.unpack("!H", data[at : at + 2])
            at += 2
        elif size == 127:
            (size,) = struct.unpack("!Q", data[at : at + 8])
            at += 8
        if opcode == 0x8 and size >= 2 and at + 2 <= len(data):
            return int(struct.unpack("!H", data[at : at + 2])[0])
        at += size
    return None


def read_to_end(sock: socket.socket, timeout: float) -> bytes:
    """Everything the peer sends until it closes (or `timeout` passes)."""
    received = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        received += chunk
    return bytes(received)


def server_holds(server_pid: int, server_port: int, client_port: int) -> bool:
    """Whether the server process still has a TCP socket to `client_port` (any state)."""
    with contextlib.suppress(psutil.Error):
        for conn in psutil.Process(server_pid).net_connections(kind="tcp"):
            mine = conn.laddr and conn.laddr.port == server_port
            if mine and conn.raddr and conn.raddr.port == client_port:
                return True
    return False


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Read what is left until the peer's FIN or reset; False if it is still open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False
