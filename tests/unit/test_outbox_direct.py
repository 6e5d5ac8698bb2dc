"""The outbox's synchronous path (`direct`): used only while nothing is queued ahead."""

from __future__ import annotations

import asyncio

from realtime.outbox import Outbox


class Socket:
    """Takes frames while `open`; records what it took."""

    def __init__(self) -> None:
        self.open = True
        self.sent: list[bytes] = []

    def __call__(self, data: bytes) -> bool:
        if not self.open:
            return False
        self.sent.append(data)
        return True


def test_frames_go_straight_to_the_socket_while_nothing_is_queued() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    for i in range(3):
        assert outbox.put(b"chunk-%d" % i, "chunk", "t1")
    assert socket.sent == [b"chunk-0", b"chunk-1", b"chunk-2"]
    assert len(outbox) == 0 and outbox.queued_bytes == 0


def test_a_refused_frame_and_everything_after_it_queue_in_order() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    outbox.put(b"a", "chunk", "t1")
    socket.open = False  # e.g. the transport paused: the peer reads slowly
    outbox.put(b"b", "chunk", "t1")
    socket.open = True
    outbox.put(b"c", "chunk", "t1")  # must not overtake b
    assert socket.sent == [b"a"]
    assert [outbox.get_nowait(), outbox.get_nowait(), outbox.get_nowait()] == [b"b", b"c", None]
    outbox.put(b"d", "chunk", "t1")  # drained: direct again
    assert socket.sent == [b"a", b"d"]


def test_stale_invalidations_are_dropped_before_the_direct_path() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    assert outbox.put(b"v2", "invalidate", "t1", 2)
    assert outbox.put(b"v1", "invalidate", "t1", 1)
    assert socket.sent == [b"v2"]


def test_a_closed_outbox_sends_nothing() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    outbox.close()
    assert not outbox.put(b"a", "chunk", "t1")
    assert socket.sent == []


async def test_a_waiting_get_wakes_for_a_queued_frame_and_for_close() -> None:
    outbox = Outbox(max_bytes=10_000)
    waiting = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    outbox.put(b"x", "chunk", "t1")
    assert await asyncio.wait_for(waiting, 5) == b"x"
    closing = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    outbox.close()
    done, _ = await asyncio.wait({closing}, timeout=5)
    assert done and closing.exception() is not None


def test_flush_writes_queued_frames_in_order_until_the_socket_refuses() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    socket.open = False  # the transport paused
    for frame in (b"a", b"b", b"c"):
        outbox.put(frame, "chunk", "t1")
    assert outbox.flush() and socket.sent == []  # still paused: nothing taken, nothing lost
    taken = iter([True, True, False])

    def take_two(data: bytes) -> bool:
        if not next(taken):
            return False
        socket.sent.append(data)
        return True

    outbox.direct = take_two
    assert outbox.flush()
    assert socket.sent == [b"a", b"b"] and len(outbox) == 1 and outbox.queued_bytes == 1
    outbox.direct = socket
    socket.open = True
    assert outbox.flush() and socket.sent == [b"a", b"b", b"c"] and len(outbox) == 0
    outbox.put(b"d", "chunk", "t1")  # drained: direct again
    assert socket.sent[-1] == b"d"


def test_flush_skips_coalesced_invalidations_and_reports_an_overflow() -> None:
    outbox, socket = Outbox(max_bytes=10_000), Socket()
    outbox.direct = socket
    socket.open = False
    outbox.put(b"v1", "invalidate", "t1", 1)
    outbox.put(b"v2", "invalidate", "t1", 2)  # replaces v1
    socket.open = True
    assert outbox.flush() and socket.sent == [b"v2"]

    small = Outbox(max_bytes=10)
    closed = Socket()
    closed.open = False
    small.direct = closed
    small.put(b"x" * 100, "chunk", "t1")
    small.put(b"x" * 100, "chunk", "t1")  # over the hard limit: overflowed
    assert small.overflowed and not small.flush()
