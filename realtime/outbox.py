"""Sans-I/O per-connection send queue, bounded in bytes, that coalesces invalidations."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from realtime.bus_metrics import SLOW_CONSUMERS, safe_add
from realtime.closecodes import CloseCode
from realtime.envelopes import MessageKind

# Close code for a consumer that stayed over its outbox bound.
CLOSE_SLOW_CONSUMER = CloseCode.SLOW_CONSUMER

# Kinds where only the newest queued message per thread matters.
_COALESCING: frozenset[str] = frozenset({"invalidate", "resync"})


class SlowConsumerError(Exception):
    """The connection stayed over its outbox bound; close it with `close_code`."""

    close_code = CLOSE_SLOW_CONSUMER


class OutboxClosedError(Exception):
    """The outbox was closed; nothing more will be sent."""


@dataclass(eq=False, slots=True)
class _Entry:
    data: bytes
    kind: str
    thread_id: str
    live: bool = True
    # Bytes this entry counts for against the bounds (see `Outbox.put`).
    weight: int = 0


class Outbox:
    """Frames waiting to be written to one websocket, bounded in bytes.

    - Chunks (and unknown kinds) are sent in the order they were put.
    - Invalidations coalesce per thread: a newer one replaces the queued one and moves to the
      back, so it is never sent ahead of chunks published before it. Versions per thread never
      decrease: an invalidation not newer than one already accepted is dropped. `resync`
      notices coalesce the same way.
    - Backpressure with high/low water marks, as in python-websockets: the connection is
      "over" once queued bytes exceed `max_bytes` (high) and stays over until they drop to
      `low_water`. Over for longer than `grace` seconds, or above `hard_limit` bytes at any
      time, is an overflow: the queue is discarded, `get()` raises `SlowConsumerError`, `put()`
      returns False and `on_overflow` is called once, so the gateway closes the connection with
      `CLOSE_SLOW_CONSUMER`. Nothing checks the clock by itself; `put`, `get` and `check` do,
      and a gateway whose sender is stuck in a write calls `check()` from a timer.
    - `direct` (optional): a function that writes a frame to the socket at once, or returns
      False when it cannot (busy writer, paused transport). While nothing is queued, `put`
      hands frames to it instead of queueing them, so an idle connection's frames skip the
      writer's wake-up; anything it refuses is queued as usual, and everything after it too,
      until `flush()` (called when the socket can take frames again) writes them through it.
    - A single frame larger than `max_bytes` (a large tool output) counts as just over it: it
      puts the connection over high water (it must be drained within `grace`) but never past
      the hard limit on its own, so it is sent instead of overflowing every subscriber at once
      (each of which would resubscribe, get it replayed and overflow again). A few of them
      queued together still make a slow consumer.
    - Version floors are bounded: `discard_thread` (unsubscribe) forgets the thread's floor,
      and at most `max_floors` threads keep one (the least recently used is forgotten
      first), so subscribe/unsubscribe churn cannot grow the connection's state. Forgetting is
      safe because a resubscription starts from the `subscribed` version, read from storage
      after the listener was added, and the session drops invalidations not newer than it.
    """

    def __init__(
        self,
        max_bytes: int = 1 << 20,
        *,
        low_water: int | None = None,
        hard_limit: int | None = None,
        grace: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        on_overflow: Callable[[], None] | None = None,
        max_floors: int = 1024,
        on_high_water: Callable[[bool], None] | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if max_floors < 1:
            raise ValueError("max_floors must be positive")
        self.max_floors = max_floors
        self.max_bytes = max_bytes
        self.low_water = max_bytes // 2 if low_water is None else low_water
        self.hard_limit = 2 * max_bytes if hard_limit is None else hard_limit
        if not 0 <= self.low_water <= max_bytes <= self.hard_limit:
            raise ValueError("need 0 <= low_water <= max_bytes <= hard_limit")
        self.grace = grace
        self._clock = clock
        self._on_overflow = on_overflow
        # Told when the outbox goes over high water (True) and back (False): so a gateway
        # watches the few outboxes in their grace period, not every connection.
        self._on_high_water = on_high_water
        # Created on the first queued frame: most connections never queue (see `direct`).
        self._entries: deque[_Entry] | None = None
        self._coalesced: dict[tuple[str, str], _Entry] = {}
        self._versions: dict[str, int] = {}
        self._bytes = 0
        self._live = 0
        self._over_since: float | None = None
        self._overflowed = False
        self._closed = False
        # The waiting `get()`'s future, if one waits (cheaper than an Event per connection).
        self._waiter: asyncio.Future[None] | None = None
        # Set by the gateway when the socket can take a frame synchronously: see `put`.
        self.direct: Callable[[bytes], bool] | None = None

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def overflowed(self) -> bool:
        return self._overflowed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def floors(self) -> int:
        """How many threads have a version floor (bounded by `max_floors`)."""
        return len(self._versions)

    @property
    def over_high_water(self) -> bool:
        return self._over_since is not None

    def __len__(self) -> int:
        return self._live

    def put(
        self, data: bytes, kind: MessageKind | str, thread_id: str, version: int | None = None
    ) -> bool:
        """Queue a frame; False once the outbox overflowed or was closed (close the socket)."""
        if self._closed or self._overflowed:
            return False
        if kind == "invalidate":
            if version is None:
                raise ValueError("an invalidation needs its version")
            last = self._versions.pop(thread_id, None)
            if last is not None and version <= last:
                self._versions[thread_id] = last  # back in, as the most recently used
                return True
            self._versions[thread_id] = version
            if len(self._versions) > self.max_floors:
                del self._versions[next(iter(self._versions))]  # the least recently used
        if not self._live and self.direct is not None and self.direct(data):
            return True  # nothing queued ahead of it and the socket took it as is
        entry = _Entry(data, kind, thread_id, weight=min(len(data), self.max_bytes + 1))
        if kind in _COALESCING:
            previous = self._coalesced.get((kind, thread_id))
            if previous is not None:
                self._kill(previous)
            self._coalesced[(kind, thread_id)] = entry
        if self._entries is None:
            self._entries = deque()
        self._entries.append(entry)
        self._bytes += entry.weight
        self._live += 1
        self._wake()
        return self._evaluate()

    def get_nowait(self) -> bytes | None:
        """The next frame, or None if nothing is queued."""
        self._raise_if_done()
        entries = self._entries
        while entries:
            entry = entries.popleft()
            if not entry.live:
                continue
            self._forget(entry)
            self._evaluate()
            return entry.data
        self._entries = None  # drained: an idle connection keeps no queue
        return None

    def flush(self) -> bool:
        """Write queued frames through `direct`, in order, until it refuses one (it stays at
        the head) or none are left; False once the outbox overflowed or was closed."""
        if self._closed or self._overflowed:
            return False
        send, entries = self.direct, self._entries
        while send is not None and entries:
            entry = entries[0]
            if entry.live:
                if not send(entry.data):
                    break
                self._forget(entry)
            entries.popleft()
        if not entries:
            self._entries = None  # drained: an idle connection keeps no queue
        return self._evaluate()

    async def get(self) -> bytes:
        """Wait for the next frame; raises `SlowConsumerError` or `OutboxClosedError`."""
        while True:
            data = self.get_nowait()
            if data is not None:
                return data
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None

    def __aiter__(self) -> Outbox:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.get()
        except OutboxClosedError:
            raise StopAsyncIteration from None

    def check(self) -> bool:
        """Re-evaluate the grace period now; False if the outbox has overflowed."""
        if self._closed or self._overflowed:
            return not self._overflowed
        return self._evaluate()

    def discard_thread(self, thread_id: str) -> None:
        """Drop queued frames of a thread (unsubscribed), and its version floor."""
        self._versions.pop(thread_id, None)
        for entry in self._entries or ():
            if entry.live and entry.thread_id == thread_id:
                self._kill(entry)
        self._evaluate()

    def close(self) -> None:
        """Discard everything; waiting `get()` calls raise `OutboxClosedError`."""
        self._closed = True
        self._clear()
        self._wake()

    # -- internals -------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _raise_if_done(self) -> None:
        if self._overflowed:
            raise SlowConsumerError("outbox stayed over its byte bound")
        if self._closed:
            raise OutboxClosedError("outbox closed")

    def _forget(self, entry: _Entry) -> None:
        entry.live = False
        self._bytes -= entry.weight
        self._live -= 1
        key = (entry.kind, entry.thread_id)
        if self._coalesced.get(key) is entry:
            del self._coalesced[key]

    def _kill(self, entry: _Entry) -> None:
        self._forget(entry)
        entry.data = b""  # release the payload now; the dead entry is skipped by `get`
        if self._entries is not None and len(self._entries) > 2 * self._live + 64:
            # Many replaced invalidations and a consumer that does not drain: compact, so dead
            # entries cannot grow without bound either.
            self._entries = deque(e for e in self._entries if e.live)

    def _evaluate(self) -> bool:
        if self._bytes > self.hard_limit:
            return self._overflow()
        now = self._clock()
        if self._bytes > self.max_bytes and self._over_since is None:
            self._over_since = now
            self._high_water(True)
        elif self._bytes <= self.low_water and self._over_since is not None:
            self._over_since = None
            self._high_water(False)
        if self._over_since is not None and now - self._over_since >= self.grace:
            return self._overflow()
        return True

    def _overflow(self) -> bool:
        self._overflowed = True
        self._clear()
        self._wake()
        safe_add(SLOW_CONSUMERS, 1)
        if self._on_overflow is not None:
            self._on_overflow()
        return False

    def _high_water(self, over: bool) -> None:
        if self._on_high_water is not None:
            self._on_high_water(over)

    def _clear(self) -> None:
        self._entries = None
        self._coalesced.clear()
        self._bytes = 0
        self._live = 0
        if self._over_since is not None:
            self._over_since = None
            self._high_water(False)
