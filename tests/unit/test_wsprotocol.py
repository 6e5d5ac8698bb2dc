"""The gateway's websocket protocol helpers: the shared text frame, Signal and Inbox; and an
accepted connection keeps its attributes in slots, with no instance dictionary."""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.frames import Frame
from websockets.streams import StreamReader

from server.transports.ws.uvicorn_ws import Inbox, Signal, WebSocketProtocol, text_frame


def parse(frame: bytes) -> Frame:
    reader = StreamReader()
    reader.feed_data(frame)
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        result: Frame = done.value
        return result
    raise AssertionError("incomplete frame")


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_text_frame_is_what_websockets_parses(size: int) -> None:
    data = b"x" * size
    frame = parse(text_frame(data))
    assert frame.fin and frame.opcode.name == "TEXT" and frame.data == data


def test_text_frame_is_built_once_per_message() -> None:
    data, other = b"a" * 300, b"b" * 300
    first = text_frame(data)
    assert text_frame(data) is first
    assert parse(text_frame(other)).data == other
    assert text_frame(data) == first


async def test_signal_wakes_every_waiter_and_clears() -> None:
    signal = Signal()
    waiters = [asyncio.create_task(signal.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    signal.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True, True, True]
    signal.clear()
    assert not signal.is_set()


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    signal = Signal()
    first, second = asyncio.create_task(signal.wait()), asyncio.create_task(signal.wait())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    signal.set()
    assert await asyncio.wait_for(second, 5)
    assert first.cancelled()


async def test_inbox_is_first_in_first_out_and_wakes_its_getter() -> None:
    inbox: Inbox[int] = Inbox()
    getter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    assert inbox.empty()
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    assert await asyncio.wait_for(getter, 5) == 1
    assert not inbox.empty()
    assert await inbox.get() == 2 and inbox.empty()


def test_inbox_forwards_what_was_queued_then_everything_after() -> None:
    inbox: Inbox[int] = Inbox()
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    seen: list[int] = []
    inbox.forward_to(seen.append)
    inbox.put_nowait(3)
    assert seen == [1, 2, 3] and inbox.empty()
    inbox.forward_to(None)  # detached: items queue again
    inbox.put_nowait(4)
    assert seen == [1, 2, 3] and not inbox.empty()


class _Transport(asyncio.Transport):
    """What uvicorn's protocol uses of a socket transport, writes kept."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_an_accepted_connection_has_no_instance_dictionary() -> None:
    """uvicorn's protocol sets more attributes than CPython shares dictionary keys for, so
    without slots every connection carried a dictionary of its own (about 1.2 KiB)."""
    accepted = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        accepted.set()
        await receive()  # the disconnect

    config = Config(app=app, ws=WebSocketProtocol, lifespan="off", log_level="warning")
    config.load()
    protocol = WebSocketProtocol(config, ServerState(), {})
    transport = _Transport()
    protocol.connection_made(transport)
    key = base64.b64encode(os.urandom(16)).decode()
    protocol.data_received(
        "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    await asyncio.wait_for(accepted.wait(), 5)
    assert b"".join(transport.written).startswith(b"HTTP/1.1 101")
    assert vars(protocol) == {}
    protocol.connection_lost(None)
    await asyncio.sleep(0)
