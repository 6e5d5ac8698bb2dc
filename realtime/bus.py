"""The bus interface: fire-and-forget pub/sub of bytes on named channels, plus replay buffers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol, Self


class Subscription(Protocol):
    """Messages of one channel in publish order. Iteration ends when the bus closes."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...


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

    async def publish(self, channel: str, data: bytes) -> None: ...

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

    async def publish_replayed(
        self, channel: str, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        """`append_replay(key, data, limit, max_bytes)`, then `publish(channel, data)`, as one
        operation (one round trip on Redis). Appended first: a late joiner that subscribes and
        then reads the replay buffer misses nothing."""
        ...

    async def publish_replayed_many(
        self,
        channel: str,
        key: str,
        items: Sequence[bytes],
        limit: int,
        max_bytes: int | None = None,
        *,
        then: Sequence[tuple[str, bytes]] = (),
        clear: bool = False,
    ) -> None:
        """`publish_replayed` of each of `items` in turn, then, when `then` or `clear` is given,
        `publish_all(then, key if clear else None)`, as one operation (one round trip on Redis;
        on a Redis Cluster, whose `then` channels may live on other shards, one per step):
        what subscribers and the replay buffer see is exactly what those calls, one after the
        other, would leave. Every message is checked before the first is published. (A commit
        sends the chunks it holds that are still unpublished, its invalidations and the clear
        of the replay buffer this way.)"""
        ...

    @property
    def healthy(self) -> bool:
        """False while the connection to the bus is lost (gateways then poll versions)."""
        ...
