"""A delta subscription's listener (server.transports.ws.session.ThreadListener with `deltas`):
an invalidation waits for its delta frame and the thread's later frames wait behind it, so the
client sees the bus's order; a failed build is the plain invalidation; nothing is sent for a
thread once unsubscribed."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from realtime.envelopes import encode_chunk, encode_invalidate
from realtime.outbox import Outbox
from server.transports.ws.session import ThreadListener

THREAD = "t1"


def drain(outbox: Outbox) -> list[tuple[str, Any]]:
    frames = []
    while (data := outbox.get_nowait()) is not None:
        frame = orjson.loads(data)
        frames.append((frame["type"], frame.get("seq", frame.get("version"))))
    return frames


class Builds:
    """Stands in for the gateway's delta builder: one future per asked version."""

    def __init__(self) -> None:
        self.asked: dict[int, asyncio.Future[tuple[bytes, int]]] = {}

    def __call__(self, thread_id: str, version: int) -> asyncio.Future[tuple[bytes, int]]:
        future: asyncio.Future[tuple[bytes, int]] = asyncio.get_running_loop().create_future()
        self.asked[version] = future
        return future

    def finish(self, version: int) -> None:
        frame = {"type": "invalidate", "thread_id": THREAD, "version": version, "delta": {}}
        self.asked[version].set_result((orjson.dumps(frame), version))


def listener() -> tuple[ThreadListener, Outbox, Builds]:
    outbox, builds = Outbox(64 * 1024), Builds()
    found = ThreadListener(THREAD, outbox, deltas=builds)
    found.open(4, [])
    return found, outbox, builds


def chunk(seq: int) -> bytes:
    return encode_chunk(THREAD, "r1", seq, 1, {"type": "text-delta", "delta": "x"})


async def test_frames_after_an_invalidation_wait_for_its_delta() -> None:
    found, outbox, builds = listener()
    found.deliver(chunk(0), "chunk", None)
    found.deliver(encode_invalidate(THREAD, 5), "invalidate", 5)
    found.deliver(chunk(1), "chunk", None)
    assert drain(outbox) == [("chunk", 0)]  # chunk 1 waits behind the delta being built
    builds.finish(5)
    await asyncio.sleep(0)
    assert drain(outbox) == [("invalidate", 5), ("chunk", 1)]


async def test_deltas_go_out_in_version_order_whichever_finishes_first() -> None:
    found, outbox, builds = listener()
    found.deliver(encode_invalidate(THREAD, 5), "invalidate", 5)
    found.deliver(chunk(0), "chunk", None)
    found.deliver(encode_invalidate(THREAD, 6), "invalidate", 6)
    builds.finish(6)
    await asyncio.sleep(0)
    assert drain(outbox) == []
    builds.finish(5)
    await asyncio.sleep(0)
    # Both reached the outbox unread: as any invalidations there, only the newest is kept,
    # never ahead of the chunk that came before it.
    assert drain(outbox) == [("chunk", 0), ("invalidate", 6)]


async def test_a_failed_build_is_the_plain_invalidation() -> None:
    found, outbox, builds = listener()
    found.deliver(encode_invalidate(THREAD, 5), "invalidate", 5)
    builds.asked[5].set_exception(RuntimeError("storage down"))
    await asyncio.sleep(0)
    frames = []
    while (data := outbox.get_nowait()) is not None:
        frames.append(orjson.loads(data))
    assert frames == [{"type": "invalidate", "thread_id": THREAD, "version": 5}]


async def test_nothing_is_sent_once_closed() -> None:
    found, outbox, builds = listener()
    found.deliver(encode_invalidate(THREAD, 5), "invalidate", 5)
    found.deliver(chunk(0), "chunk", None)
    found.closed = True
    builds.finish(5)
    await asyncio.sleep(0)
    assert drain(outbox) == []
