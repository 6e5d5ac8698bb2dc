"""Deadlines on one timer per loop (server/transports/ws/deadlines.py): each fires when due and
not before, in order, once; a cancelled one never fires; an earlier one added later moves the
timer; one that fails does not keep the others from firing; cancelled entries are compacted."""

from __future__ import annotations

import asyncio

import pytest

from server.transports.ws import deadlines as module
from server.transports.ws.deadlines import Deadlines, deadlines


class Target:
    def __init__(self, loop: asyncio.AbstractEventLoop, fired: list[tuple[str, float]], name: str):
        self.loop, self.fired, self.name = loop, fired, name

    def expired(self) -> None:
        self.fired.append((self.name, self.loop.time()))
        if self.name == "broken":
            raise RuntimeError("broken")


async def test_each_fires_once_when_due_in_order_and_cancelled_ones_never(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    timers = Deadlines(loop)
    fired: list[tuple[str, float]] = []
    now = loop.time()
    due = {"late": now + 0.15, "broken": now + 0.05, "early": now + 0.05, "gone": now + 0.1}
    entries = {name: timers.at(when, Target(loop, fired, name)) for name, when in due.items()}
    timers.at(now + 0.02, Target(loop, fired, "earliest"))  # added last, due first
    timers.cancel(entries["gone"])
    timers.cancel(entries["gone"])  # twice: nothing more
    assert len(timers) == 4
    await asyncio.sleep(0.3)
    assert [name for name, _ in fired] == ["earliest", "broken", "early", "late"]
    for name, at in fired:
        assert at >= (now + 0.02 if name == "earliest" else due[name])
    assert len(timers) == 0
    assert "deadline callback failed" in caplog.text


async def test_cancelled_entries_are_compacted_and_the_timer_follows() -> None:
    loop = asyncio.get_running_loop()
    timers = Deadlines(loop)
    fired: list[tuple[str, float]] = []
    now = loop.time()
    early = [timers.at(now + 0.05, Target(loop, fired, "cancelled")) for _ in range(200)]
    timers.at(now + 0.1, Target(loop, fired, "kept"))
    for entry in early:
        timers.cancel(entry)
    assert len(timers) == 1
    assert len(timers._heap) <= module.COMPACT_AFTER + 1
    await asyncio.sleep(0.2)
    assert [name for name, _ in fired] == ["kept"]


async def test_one_per_loop() -> None:
    loop = asyncio.get_running_loop()
    assert deadlines(loop) is deadlines(loop)
