"""One frame larger than the outbox bound is sent alone; it does not make a slow consumer."""

from __future__ import annotations

from realtime.outbox import Outbox


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_frame_over_the_hard_limit_is_queued_and_sent() -> None:
    clock = Clock()
    outbox = Outbox(1000, clock=clock)
    big = b"x" * 5000  # five times the bound, over the hard limit (2000) on its own
    assert outbox.put(big, "chunk", "t")  # over high water, far from an overflow
    assert outbox.put(b"small", "chunk", "t")
    clock.now += 4  # within the grace period (5 s) the consumer drains
    assert outbox.check()
    assert outbox.get_nowait() == big
    assert outbox.get_nowait() == b"small"
    assert not outbox.overflowed


def test_several_oversized_frames_still_make_a_slow_consumer() -> None:
    outbox = Outbox(1000, clock=Clock())
    results = [outbox.put(b"x" * 5000, "chunk", "t") for _ in range(3)]
    assert results == [True, False, False]  # two together pass the hard limit
    assert outbox.overflowed
