"""Helpers for the bus and hub conformance suites: open each backend, simulate Redis outages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from realtime.bus import Bus
from realtime.memory import MemoryBus
from realtime.redis import RedisBus
from realtime.redis_cluster import RedisClusterBus
from realtime.redis_urls import cluster_client, parse_cluster_url
from tests.services import require_redis, require_redis_cluster, unique_prefix

BACKENDS = ["memory", "redis", "redis-cluster"]
TIMEOUT = 5.0

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float = TIMEOUT) -> T:
    """Every wait in these suites is bounded: a bug fails a test, it never hangs the run."""
    # asyncio.timeout rather than wait_for, which can swallow a cancellation on Python 3.11.
    async with asyncio.timeout(timeout):
        return await awaitable


async def eventually(
    predicate: Callable[[], bool], timeout: float = TIMEOUT, interval: float = 0.005
) -> None:
    async def poll() -> None:
        # Polling on purpose: the states observed here (health, queue sizes) have no event.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(interval)

    await within(poll(), timeout)


async def cleanup_prefix(prefix: str, *, cluster: bool = False) -> None:
    """Delete every key under a test prefix (bounded: SCAN stops when the cursor wraps)."""
    if cluster:
        async with admin_cluster() as admin:
            # A cluster SCAN visits every master; keys are deleted one by one (one slot each).
            for key in [key async for key in admin.scan_iter(match=prefix + "*", count=500)]:
                await admin.delete(key)
        return
    client = Redis.from_url(require_redis())
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@asynccontextmanager
async def admin_cluster() -> AsyncIterator[RedisCluster]:
    client = cluster_client(parse_cluster_url(require_redis_cluster()))
    try:
        await client.initialize()
        yield client
    finally:
        await client.aclose()


@asynccontextmanager
async def admin_redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(require_redis())
    try:
        yield client
    finally:
        await client.aclose()


async def client_ids(admin: Redis, name: str) -> list[int]:
    clients: list[dict[str, Any]] = await admin.client_list()
    return [int(c["id"]) for c in clients if c.get("name") == name]


async def numsub(admin: Redis, channel: str) -> int:
    counts = await admin.pubsub_numsub(channel)
    return int(counts[0][1])


def make_redis_bus(url: str | None = None, **options: Any) -> RedisBus:
    url = url or require_redis()
    options.setdefault("min_backoff", 0.02)
    options.setdefault("max_backoff", 0.2)
    options.setdefault("connect_timeout", 1.0)
    return RedisBus(url, prefix=options.pop("prefix", unique_prefix()), **options)


def make_cluster_bus(url: str | None = None, **options: Any) -> RedisClusterBus:
    url = url or require_redis_cluster()
    options.setdefault("min_backoff", 0.02)
    options.setdefault("max_backoff", 0.2)
    options.setdefault("connect_timeout", 1.0)
    return RedisClusterBus(url, prefix=options.pop("prefix", unique_prefix()), **options)


@asynccontextmanager
async def open_test_bus(kind: str, **options: Any) -> AsyncIterator[Bus]:
    """An opened bus of the given backend, closed and cleaned up afterwards."""
    if kind == "memory":
        memory = MemoryBus(**options)
        async with memory:
            yield memory
        return
    if kind == "redis-cluster":
        cluster_bus = make_cluster_bus(**options)
        try:
            async with cluster_bus:
                yield cluster_bus
        finally:
            await cleanup_prefix(cluster_bus.prefix, cluster=True)
        return
    require_redis()
    redis_bus = make_redis_bus(**options)
    try:
        async with redis_bus:
            yield redis_bus
    finally:
        await cleanup_prefix(redis_bus.prefix)


def subscription_count(bus: Bus, channel: str) -> int:
    """Bus-level subscriptions of a channel in this process (one per thread with a hub)."""
    assert isinstance(bus, MemoryBus | RedisBus | RedisClusterBus)
    return bus.subscriber_count(channel)


class TcpProxy:
    """A TCP relay in front of Redis that a test can stop and restart: a real outage."""

    def __init__(self, target_url: str | None = None) -> None:
        parts = urlsplit(target_url or require_redis())
        self._target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        # Closing the sockets ends the relays; handlers are not cancelled because asyncio's
        # stream server (3.11) logs an error for a cancelled connection callback.
        for writer in list(self._writers):
            writer.close()
        if self._handlers:
            await within(asyncio.wait(set(self._handlers)))
        self._writers.clear()

    def freeze(self) -> None:
        """Stop relaying bytes but keep every connection open: a silent, half-open network."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            self._writers.add(upstream_writer)
            pipes = [
                asyncio.create_task(self._pipe(reader, upstream_writer)),
                asyncio.create_task(self._pipe(upstream_reader, writer)),
            ]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            for stream in (writer, upstream_writer):
                if stream is not None:
                    stream.close()
                    self._writers.discard(stream)
            self._handlers.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
