"""The gateway's websocket protocol helpers: the shared text frame, Signal and Inbox."""

from __future__ import annotations

import asyncio

import pytest
from websockets.frames import Frame
from websockets.streams import StreamReader

from server.transports.ws.uvicorn_ws import Inbox, Signal, text_frame


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
