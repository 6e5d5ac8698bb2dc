"""The per-connection outbox: order, coalescing, byte bound and the slow-consumer signal."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.outbox import (
    CLOSE_SLOW_CONSUMER,
    Outbox,
    OutboxClosedError,
    SlowConsumerError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(outbox: Outbox) -> list[bytes]:
    frames: list[bytes] = []
    for _ in range(10_000):  # bounded: an outbox never holds more in these tests
        frame = outbox.get_nowait()
        if frame is None:
            return frames
        frames.append(frame)
    raise AssertionError("outbox did not drain")


def inv(thread_id: str, version: int) -> bytes:
    return b'{"type":"invalidate","thread_id":"%s","version":%d}' % (thread_id.encode(), version)


def test_close_code_is_documented_value() -> None:
    assert CLOSE_SLOW_CONSUMER == 4408
    assert SlowConsumerError.close_code == CLOSE_SLOW_CONSUMER


def test_chunks_keep_their_order() -> None:
    outbox = Outbox(max_bytes=10_000)
    frames = [b"chunk-%d" % i for i in range(50)]
    for frame in frames:
        assert outbox.put(frame, "chunk", "t1")
    assert len(outbox) == 50
    assert drain(outbox) == frames
    assert outbox.queued_bytes == 0


def test_invalidations_of_a_thread_coalesce_to_the_latest() -> None:
    outbox = Outbox(max_bytes=10_000)
    for version in (1, 2, 3):
        outbox.put(inv("t1", version), "invalidate", "t1", version)
    outbox.put(inv("t2", 7), "invalidate", "t2", 7)
    assert len(outbox) == 2
    assert outbox.queued_bytes == len(inv("t1", 3)) + len(inv("t2", 7))
    assert drain(outbox) == [inv("t1", 3), inv("t2", 7)]


def test_a_replacing_invalidation_goes_behind_earlier_chunks() -> None:
    outbox = Outbox(max_bytes=10_000)
    outbox.put(inv("t1", 1), "invalidate", "t1", 1)
    outbox.put(b"chunk-a", "chunk", "t1")
    outbox.put(inv("t1", 2), "invalidate", "t1", 2)
    outbox.put(b"chunk-b", "chunk", "t1")
    assert drain(outbox) == [b"chunk-a", inv("t1", 2), b"chunk-b"]


def test_versions_never_decrease_even_after_sending() -> None:
    outbox = Outbox(max_bytes=10_000)
    outbox.put(inv("t1", 5), "invalidate", "t1", 5)
    assert drain(outbox) == [inv("t1", 5)]
    assert outbox.put(inv("t1", 4), "invalidate", "t1", 4)  # stale: accepted, not sent
    assert outbox.put(inv("t1", 5), "invalidate", "t1", 5)  # duplicate: not sent either
    outbox.put(inv("t1", 3), "invalidate", "t1", 3)
    assert drain(outbox) == []
    outbox.put(inv("t1", 6), "invalidate", "t1", 6)
    assert drain(outbox) == [inv("t1", 6)]


def test_an_invalidation_needs_a_version() -> None:
    with pytest.raises(ValueError):
        Outbox().put(b"x", "invalidate", "t1")


def test_resync_notices_coalesce_per_thread() -> None:
    outbox = Outbox(max_bytes=10_000)
    outbox.put(b"resync-1", "resync", "t1")
    outbox.put(b"chunk", "chunk", "t1")
    outbox.put(b"resync-1", "resync", "t1")
    assert drain(outbox) == [b"chunk", b"resync-1"]


def test_the_hard_limit_overflows_at_once() -> None:
    calls: list[bool] = []
    outbox = Outbox(max_bytes=100, on_overflow=lambda: calls.append(True))
    assert outbox.hard_limit == 200
    # Frames under the bound (one frame over it counts as the bound: test_outbox_oversize.py).
    assert outbox.put(b"x" * 90, "chunk", "t1")
    assert outbox.put(b"x" * 90, "chunk", "t1")
    assert not outbox.put(b"x" * 30, "chunk", "t1")
    assert outbox.overflowed
    assert outbox.queued_bytes == 0  # memory is released immediately
    assert calls == [True]
    with pytest.raises(SlowConsumerError) as raised:
        outbox.get_nowait()
    assert raised.value.close_code == 4408
    assert not outbox.put(b"more", "chunk", "t1")
    assert calls == [True]  # signalled once


def test_over_the_bound_for_longer_than_the_grace_period_overflows() -> None:
    clock = Clock()
    outbox = Outbox(max_bytes=100, grace=2.0, clock=clock)
    assert outbox.put(b"x" * 120, "chunk", "t1")
    assert outbox.over_high_water
    clock.now = 1.9
    assert outbox.check()
    clock.now = 2.0
    assert not outbox.check()
    assert outbox.overflowed


def over_high_water(outbox: Outbox) -> bool:
    # Read through a call: mypy keeps a property narrowed by an assert across the method calls
    # that change it, and would call the second assert unreachable.
    return outbox.over_high_water


def test_draining_below_the_low_water_mark_resets_the_grace_period() -> None:
    clock = Clock()
    outbox = Outbox(max_bytes=100, low_water=40, grace=2.0, clock=clock)
    for _ in range(6):
        outbox.put(b"x" * 20, "chunk", "t1")  # 120 bytes: over
    clock.now = 1.0
    outbox.get_nowait()
    outbox.get_nowait()  # 80 bytes: under high water but above low water, still over
    assert over_high_water(outbox)
    clock.now = 1.5
    outbox.get_nowait()
    outbox.get_nowait()  # 40 bytes: at low water, recovered
    assert not over_high_water(outbox)
    clock.now = 10.0
    assert outbox.check()
    assert not outbox.overflowed


def test_going_over_high_water_and_back_is_told_once_each_way() -> None:
    # What the gateway's watchdog visits: only the outboxes over high water.
    clock = Clock()
    told: list[bool] = []
    outbox = Outbox(max_bytes=100, low_water=40, grace=2.0, clock=clock, on_high_water=told.append)
    outbox.put(b"x" * 60, "chunk", "t1")
    assert told == []
    outbox.put(b"x" * 60, "chunk", "t1")  # 120: over
    outbox.put(b"x" * 10, "chunk", "t1")
    assert told == [True]
    outbox.get_nowait()  # 70: still over (above low water)
    assert told == [True]
    outbox.get_nowait()
    outbox.get_nowait()  # 0: back
    assert told == [True, False]
    outbox.put(b"x" * 120, "chunk", "t1")
    clock.now = 3.0
    assert not outbox.check()  # overflowed: its queue is gone, and so is the watch
    assert told == [True, False, True, False]
    other = Outbox(max_bytes=100, on_high_water=told.append)
    other.put(b"x" * 120, "chunk", "t1")
    other.close()
    assert told[-2:] == [True, False]


def test_a_consumer_hovering_just_under_the_bound_after_going_over_is_closed() -> None:
    clock = Clock()
    outbox = Outbox(max_bytes=100, low_water=50, grace=1.0, clock=clock)
    outbox.put(b"x" * 60, "chunk", "t1")
    outbox.put(b"x" * 60, "chunk", "t1")  # 120: over
    outbox.get_nowait()
    outbox.put(b"x" * 30, "chunk", "t1")  # 90: under the bound, never down to low water
    clock.now = 0.9
    assert outbox.check()
    clock.now = 1.0
    assert not outbox.check()


def test_a_grace_of_zero_overflows_as_soon_as_the_bound_is_passed() -> None:
    outbox = Outbox(max_bytes=10, grace=0.0)
    assert not outbox.put(b"x" * 11, "chunk", "t1")


def test_watermark_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        Outbox(max_bytes=0)
    with pytest.raises(ValueError):
        Outbox(max_bytes=100, low_water=101)
    with pytest.raises(ValueError):
        Outbox(max_bytes=100, hard_limit=99)


def test_many_replaced_invalidations_stay_small() -> None:
    outbox = Outbox(max_bytes=1000, grace=0.0)
    for version in range(1, 20_001):
        assert outbox.put(inv("t1", version), "invalidate", "t1", version)
    assert len(outbox) == 1
    assert outbox.queued_bytes == len(inv("t1", 20_000))
    assert drain(outbox) == [inv("t1", 20_000)]


def test_discard_thread_drops_its_frames_and_its_version_floor() -> None:
    outbox = Outbox(max_bytes=10_000)
    outbox.put(b"t1-chunk", "chunk", "t1")
    outbox.put(b"t2-chunk", "chunk", "t2")
    outbox.put(inv("t1", 3), "invalidate", "t1", 3)
    outbox.discard_thread("t1")
    assert outbox.queued_bytes == len(b"t2-chunk")
    assert outbox.floors == 0
    # A resubscription starts from its `subscribed` version (the session's floor), not this one.
    outbox.put(inv("t1", 2), "invalidate", "t1", 2)
    assert drain(outbox) == [b"t2-chunk", inv("t1", 2)]


def test_version_floors_stay_bounded_under_subscribe_unsubscribe_churn() -> None:
    outbox = Outbox(max_bytes=1 << 20, max_floors=8)
    for n in range(10_000):
        thread = f"t{n}"
        outbox.put(inv(thread, 1), "invalidate", thread, 1)
        if n % 2:
            outbox.discard_thread(thread)  # unsubscribed
        drain(outbox)
    assert outbox.floors <= 8


def test_version_floors_keep_the_most_recently_used_threads() -> None:
    outbox = Outbox(max_bytes=1 << 20, max_floors=3)
    outbox.put(inv("kept", 5), "invalidate", "kept", 5)
    for n in range(100):  # never unsubscribed: only the bound forgets them
        outbox.put(inv(f"t{n}", 1), "invalidate", f"t{n}", 1)
        # A stale invalidation of `kept` is still dropped: using its floor keeps it.
        assert outbox.put(inv("kept", 4), "invalidate", "kept", 4)
    assert outbox.floors == 3
    assert inv("kept", 4) not in drain(outbox)


async def test_get_waits_for_a_frame() -> None:
    outbox = Outbox(max_bytes=10_000)
    getter = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    assert not getter.done()
    outbox.put(b"hello", "chunk", "t1")
    assert await asyncio.wait_for(getter, 1) == b"hello"


async def test_close_wakes_a_waiting_getter_and_ends_iteration() -> None:
    outbox = Outbox(max_bytes=10_000)
    getter = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    outbox.close()
    with pytest.raises(OutboxClosedError):
        await asyncio.wait_for(getter, 1)
    assert not outbox.put(b"late", "chunk", "t1")

    iterated = Outbox(max_bytes=10_000)
    iterated.put(b"a", "chunk", "t1")

    async def collect() -> list[bytes]:
        frames = []
        async for frame in iterated:
            frames.append(frame)
            iterated.close()
        return frames

    assert await asyncio.wait_for(collect(), 1) == [b"a"]


async def test_overflow_wakes_a_waiting_getter() -> None:
    outbox = Outbox(max_bytes=10)
    getter = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    # A getter waiting means the queue was empty; two huge frames at once overflow (a single
    # one is sent: test_outbox_oversize.py).
    outbox.put(b"x" * 100, "chunk", "t1")
    outbox.put(b"x" * 100, "chunk", "t1")
    with pytest.raises(SlowConsumerError):
        await asyncio.wait_for(getter, 1)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("chunk"), st.sampled_from(["a", "b", "c"]), st.integers(0, 50)),
        st.tuples(st.just("invalidate"), st.sampled_from(["a", "b", "c"]), st.integers(0, 50)),
        st.tuples(st.just("get"), st.just(""), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_invariants_hold_for_any_interleaving(ops: list[tuple[str, str, int]]) -> None:
    outbox = Outbox(max_bytes=1 << 20)
    sent: list[bytes] = []
    chunks_put: list[bytes] = []
    counter = 0
    for op, thread_id, number in ops:
        if op == "get":
            frame = outbox.get_nowait()
            if frame is not None:
                sent.append(frame)
        elif op == "chunk":
            counter += 1
            frame = b"chunk:%s:%d" % (thread_id.encode(), counter)
            chunks_put.append(frame)
            outbox.put(frame, "chunk", thread_id)
        else:
            outbox.put(inv(thread_id, number), "invalidate", thread_id, number)
        assert outbox.queued_bytes >= 0
    sent.extend(drain(outbox))
    assert outbox.queued_bytes == 0 and len(outbox) == 0
    # Every chunk is sent, in order.
    assert [f for f in sent if f.startswith(b"chunk:")] == chunks_put
    # Per thread, invalidation versions strictly increase.
    last: dict[str, int] = {}
    for frame in sent:
        if frame.startswith(b'{"type":"invalidate"'):
            thread_id = frame.split(b'"thread_id":"')[1].split(b'"')[0].decode()
            version = int(frame.rsplit(b":", 1)[1].rstrip(b"}"))
            assert version > last.get(thread_id, -1)
            last[thread_id] = version
