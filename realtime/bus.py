"""The bus interface: fire-and-forget pub/sub of bytes on named channels, plus replay buffers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol, Self

from realtime.bus_support import ReconnectListener
from realtime.publish_options import PublishOptions


class Subscription(Protocol):
    """Messages of one channel in publish order. Iteration ends when the bus closes."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    @property
    def dropped(self) -> int:
        """Messages lost so far because this subscriber fell behind (oldest first): a consumer
        that sees it grow tells its clients to resync."""
        ...


class Bus(Protocol):
    """Implemented by `MemoryBus` (one process) and `RedisBus` (redis-py asyncio pub/sub).

    Delivery is at-most-once and live only: storage is the source of truth, and clients refetch
    snapshots after an invalidation, a gap or a reconnect.
    """

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    # `async with open_bus(url) as bus` opens and closes it (every backend is an AsyncResource).
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        """Publish `data` (one message, or several in order) on `channel`; with `options`, keep
        each in `options.replay`'s buffer too (appended before it is published: a late joiner
        that subscribes and then reads the buffer misses nothing), then publish `options.then`
        and clear the buffer when `options.clear_replay` (`PublishOptions`), as one operation:
        one round trip on Redis (on a Redis Cluster, whose `then` channels may live on other
        shards, one per step). What subscribers and the buffer see is what one message at a
        time would leave. Every message is checked before the first is published."""
        ...

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]: ...

    # Bounded replay buffer (the in-flight step's chunks, for late joiners), shared by every
    # process on the bus. `append_replay` keeps the newest entries per key: at most `limit` of
    # them and, with `max_bytes`, at most that many bytes together, except that the entry just
    # appended is always kept (one entry larger than `max_bytes` stays alone). Atomic: a
    # concurrent reader sees the buffer before or after the append and trim, never between.
    async def append_replay(
        self, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None: ...
    async def read_replay(self, key: str) -> list[bytes]: ...
    async def clear_replay(self, key: str) -> None: ...

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        """Publish each `(channel, data)` in order, then `clear_replay(clear_key)` when given,
        as one operation (one round trip on Redis)."""
        ...

    @property
    def healthy(self) -> bool:
        """False while the connection to the bus is lost (gateways then poll versions)."""
        ...

    # Called after the bus reconnected (messages may have been lost meanwhile): the hub and the
    # inbox resync their clients. A bus that never loses its connection accepts and keeps them.
    def add_reconnect_listener(self, callback: ReconnectListener) -> None: ...
    def remove_reconnect_listener(self, callback: ReconnectListener) -> None: ...
