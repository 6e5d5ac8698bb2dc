"""In-process bus for the embedded single-process deployment."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from realtime.bus_errors import BusClosedError
from realtime.bus_support import (
    DEFAULT_MAX_QUEUE,
    AsyncResource,
    BusState,
    LocalSubscriptions,
    QueueSubscription,
    ReconnectListener,
    ReconnectListeners,
    check_message,
    check_replay_bounds,
)
from realtime.publish_options import PublishOptions, Replay, publish_batch, publish_stepwise

DEFAULT_REPLAY_TTL = 3600.0
_SWEEP_EVERY = 1024


class _ReplayBuffer:
    __slots__ = ("expires_at", "items", "size")

    def __init__(self) -> None:
        self.items: deque[bytes] = deque()
        self.size = 0  # bytes of `items` together
        self.expires_at = 0.0

    def append(self, data: bytes, limit: int, max_bytes: int | None) -> None:
        self.items.append(data)
        self.size += len(data)
        # Oldest first, never the entry just appended.
        while len(self.items) > 1 and (
            len(self.items) > limit or (max_bytes is not None and self.size > max_bytes)
        ):
            self.size -= len(self.items.popleft())


class MemoryBus(AsyncResource):
    """Implements `realtime.bus.Bus` inside one process.

    Every subscription has its own bounded queue (`max_queue` messages; see `QueueSubscription`
    for the drop-oldest policy). Subscribers receive the very bytes object that was published.
    Replay buffers expire `replay_ttl` seconds after their last append, like the Redis keys, so
    a run that died without clearing its buffer does not pin memory forever.
    """

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        replay_ttl: float = DEFAULT_REPLAY_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replay_ttl = replay_ttl
        self._clock = clock
        self._state = BusState.NEW
        self._subscriptions: LocalSubscriptions[str] = LocalSubscriptions(max_queue)
        self._replay: dict[str, _ReplayBuffer] = {}
        self._appends = 0
        self._listeners = ReconnectListeners()

    async def open(self) -> None:
        if self._state is BusState.CLOSED:
            raise BusClosedError("a closed MemoryBus cannot be reopened")
        self._state = BusState.OPEN

    async def close(self) -> None:
        self._state = BusState.CLOSED
        self._subscriptions.close_all()
        self._replay.clear()

    @property
    def healthy(self) -> bool:
        return self._state is BusState.OPEN

    def _require_open(self) -> None:
        if self._state is not BusState.OPEN:
            raise BusClosedError(f"MemoryBus is {self._state.value}, not open")

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        self._require_open()
        if options is None and isinstance(data, bytes):  # one plain message: the common case
            self._subscriptions.push(channel, data)
            return
        batch = publish_batch(channel, data, options)
        if batch is not None:
            await publish_stepwise(self, batch)

    async def publish_entry(self, channel: str, data: bytes, replay: Replay | None) -> None:
        if replay is not None:
            await self.append_replay(replay.key, data, replay.limit, replay.max_bytes)
        self._require_open()
        self._subscriptions.push(channel, data)

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[QueueSubscription]:
        self._require_open()
        subscription = self._subscriptions.add(channel, channel)
        try:
            yield subscription
        finally:
            self._subscriptions.remove(channel, subscription)

    def subscriber_count(self, channel: str) -> int:
        """Local subscriptions of `channel` (the hub keeps this at one per thread)."""
        return self._subscriptions.count(channel)

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        for _, data in messages:
            check_message(data)
        for channel, data in messages:
            await self.publish(channel, data)
        if clear_key is not None:
            await self.clear_replay(clear_key)

    async def append_replay(
        self, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        self._require_open()
        check_replay_bounds(limit, max_bytes)
        now = self._clock()
        buffer = self._replay.get(key)
        if buffer is None or buffer.expires_at <= now:
            buffer = self._replay[key] = _ReplayBuffer()
        buffer.append(data, limit, max_bytes)
        buffer.expires_at = now + self._replay_ttl
        self._appends += 1
        if self._appends % _SWEEP_EVERY == 0:
            self._sweep(now)

    async def read_replay(self, key: str) -> list[bytes]:
        self._require_open()
        buffer = self._replay.get(key)
        if buffer is None:
            return []
        if buffer.expires_at <= self._clock():
            del self._replay[key]
            return []
        return list(buffer.items)

    async def clear_replay(self, key: str) -> None:
        self._require_open()
        self._replay.pop(key, None)

    def _sweep(self, now: float) -> None:
        expired = [key for key, buffer in self._replay.items() if buffer.expires_at <= now]
        for key in expired:
            del self._replay[key]

    def add_reconnect_listener(self, callback: ReconnectListener) -> None:
        """Accepted for parity with `RedisBus`; an in-process bus never loses its connection."""
        self._listeners.add(callback)

    def remove_reconnect_listener(self, callback: ReconnectListener) -> None:
        self._listeners.remove(callback)
