"""Exact deadlines for many connections on one timer per event loop: its earliest.

A timer per connection (`loop.call_at`) costs a `TimerHandle`, a copy of the context, the
callback's bound method and its arguments: about half a KiB for every open connection, for a
deadline (its token's expiry) that is usually an hour away. Here a connection's deadline is one
heap entry, and the loop holds a single timer, for the earliest deadline of all. Times are the
loop's, exact: a deadline fires when it is due, not rounded to a tick.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Protocol

from server.transports.ws.per_loop import PerLoop

log = logging.getLogger(__name__)

# Cancelled entries stay in the heap until they come up, unless they are more than half of it
# (and more than this many): then the heap is rebuilt without them.
COMPACT_AFTER = 64


class Expiring(Protocol):
    def expired(self) -> None:
        """Its deadline came."""


class Deadline:
    """One entry of the heap: when, a sequence number (ties in order of arrival), and whom to
    call (None once cancelled)."""

    __slots__ = ("sequence", "target", "when")

    def __init__(self, when: float, sequence: int, target: Expiring) -> None:
        self.when = when
        self.sequence = sequence
        self.target: Expiring | None = target

    def __lt__(self, other: Deadline) -> bool:
        return (self.when, self.sequence) < (other.when, other.sequence)


class Deadlines:
    __slots__ = ("_cancelled", "_heap", "_loop", "_sequence", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[Deadline] = []
        self._sequence = itertools.count()
        self._cancelled = 0
        self._timer: asyncio.TimerHandle | None = None

    def at(self, when: float, target: Expiring) -> Deadline:
        """Call `target.expired()` at loop time `when`; returns what `cancel` takes."""
        entry = Deadline(when, next(self._sequence), target)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._schedule()
        return entry

    def cancel(self, entry: Deadline) -> None:
        if entry.target is None:
            return
        entry.target = None
        self._cancelled += 1
        if self._cancelled > COMPACT_AFTER and self._cancelled * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e.target is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0
            self._schedule()

    def __len__(self) -> int:
        """Deadlines still to come."""
        return len(self._heap) - self._cancelled

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._heap:
            self._timer = self._loop.call_at(self._heap[0].when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        heap = self._heap
        while heap and heap[0].when <= now:
            target = heapq.heappop(heap).target
            if target is None:
                self._cancelled -= 1
                continue
            try:
                target.expired()
            except Exception:  # one failing connection must not keep the others open
                log.exception("deadline callback failed")
        self._schedule()


# The deadlines of each loop.
deadlines = PerLoop(Deadlines)
