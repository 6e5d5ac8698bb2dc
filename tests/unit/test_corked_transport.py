"""The corked transport: one write per loop step, in order, flushed before close, none after
abort."""

from __future__ import annotations

import asyncio

from server.transports.corked import CorkedTransport


class Recorder(asyncio.Transport):
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[object] = []
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(bytes(data))

    def write_eof(self) -> None:
        self.calls.append("eof")

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


async def step() -> None:
    """Let the loop run the callbacks scheduled so far."""
    await asyncio.sleep(0)


async def test_the_writes_of_one_step_are_one_write() -> None:
    inner = Recorder()
    corked = CorkedTransport(inner, asyncio.get_running_loop())
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.write(b"")
    corked.write(b"{}")
    assert inner.calls == []
    assert corked.get_write_buffer_size() == 21
    await step()
    assert inner.calls == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    corked.write(b"next")
    await step()
    assert inner.calls[1:] == [b"next"]


async def test_a_single_write_is_passed_on_as_the_same_object() -> None:
    written: list[bytes] = []
    inner = Recorder()
    inner.write = written.append  # type: ignore[method-assign,assignment]
    corked = CorkedTransport(inner, asyncio.get_running_loop())
    frame = b"\x81\x02{}"
    corked.write(frame)
    await step()
    assert written[0] is frame


async def test_close_and_eof_write_what_is_held_first() -> None:
    inner = Recorder()
    corked = CorkedTransport(inner, asyncio.get_running_loop())
    corked.write(b"a")
    corked.write_eof()
    corked.write(b"b")
    corked.close()
    await step()
    assert inner.calls == [b"a", "eof", b"b", "close"]


async def test_abort_drops_what_is_held_and_nothing_follows_a_close() -> None:
    inner = Recorder()
    corked = CorkedTransport(inner, asyncio.get_running_loop())
    corked.write(b"dropped")
    corked.abort()
    corked.write(b"after")  # the transport is closing: written nowhere
    await step()
    assert inner.calls == ["abort"]


async def test_write_now_goes_out_at_once_after_what_is_held() -> None:
    inner = Recorder()
    corked = CorkedTransport(inner, asyncio.get_running_loop())
    corked.write_now(b"\x89\x04ping")  # alone in its step: no callback waits for it
    assert inner.calls == [b"\x89\x04ping"]
    corked.write(b"frame")
    corked.write_now(b"\x89\x04pong")  # never ahead of a frame written before it
    assert inner.calls[1:] == [b"frame", b"\x89\x04pong"]
    await step()
    assert len(inner.calls) == 3  # the scheduled flush finds nothing left
    inner.closing = True
    corked.write_now(b"late")  # a closing transport is not written to
    assert len(inner.calls) == 3
