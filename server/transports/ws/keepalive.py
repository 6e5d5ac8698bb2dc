"""One keepalive timer per event loop and tick, shared by every connection whose ping falls due
in that tick.

A timer per connection (uvicorn's way) wakes the loop as often as connections happened to open
apart: a thousand tabs opened over two seconds are a thousand wake-ups every ping interval,
each doing one ping. The wheel rounds each connection's next ping up to a tick (a twentieth of
the interval, at most a second), so the loop wakes once per tick for all the pings due in it,
however spread out the connections opened. A ping is at most one tick late, and from then on
exactly one interval apart (the next is counted from the tick, not from when its turn in the
batch came); an unanswered ping is found at the next one, so a peer gets the interval less the
milliseconds the batch took before its ping to answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

from server.transports.ws.per_loop import PerLoop

log = logging.getLogger(__name__)

# The tick is this fraction of the ping interval, and never longer than MAX_TICK seconds.
TICK_FRACTION = 1 / 20
MAX_TICK = 1.0

# A tick: its number and its length in seconds (it ends at number * length on the loop's clock).
Tick = tuple[int, float]


class Pinger(Protocol):
    def keepalive_due(self) -> None:
        """Its tick came: ping the peer, or drop it if the last ping went unanswered."""


class KeepaliveWheel:
    """The ticks of one event loop: tick number → the connections due in it, and its timer."""

    __slots__ = ("_due", "_firing", "_loop", "_timers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: dict[Tick, dict[Pinger, None]] = {}  # insertion-ordered: pinged in order
        self._timers: dict[Tick, asyncio.TimerHandle] = {}
        self._firing: float | None = None  # while a tick runs: the time it was due

    @staticmethod
    def tick_length(interval: float) -> float:
        return min(MAX_TICK, interval * TICK_FRACTION)

    def add(self, pinger: Pinger, interval: float) -> Tick:
        """Make `pinger` due `interval` seconds from now, rounded up to its tick; returns the
        key that `discard` takes. From inside a tick, "now" is the time the tick was due, so a
        connection pinged by it stays `interval` apart, not a tick more each round."""
        step = self.tick_length(interval)
        now = self._loop.time() if self._firing is None else self._firing
        tick = math.ceil((now + interval) / step - 1e-9)
        key = (tick, step)
        due = self._due.get(key)
        if due is None:
            self._due[key] = due = {}
            self._timers[key] = self._loop.call_at(tick * step, self._fire, key)
        due[pinger] = None
        return key

    def discard(self, pinger: Pinger, key: Tick) -> None:
        """`pinger` is no longer due at `key` (it closed); a tick left empty loses its timer."""
        due = self._due.get(key)
        if due is None or pinger not in due:
            return
        del due[pinger]
        if not due:
            del self._due[key]
            self._timers.pop(key).cancel()

    def __len__(self) -> int:
        """How many connections are due in some tick."""
        return sum(map(len, self._due.values()))

    def timers(self) -> int:
        """How many ticks hold a timer."""
        return len(self._timers)

    def _fire(self, key: Tick) -> None:
        self._timers.pop(key, None)
        self._firing = key[0] * key[1]
        try:
            for pinger in self._due.pop(key, {}):
                try:
                    pinger.keepalive_due()
                except Exception:  # one broken connection must not starve the others of pings
                    log.exception("keepalive ping failed")
        finally:
            self._firing = None


# The wheel of each loop.
wheel = PerLoop(KeepaliveWheel)
