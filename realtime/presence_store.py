"""Ephemeral presence per thread, by gateway: in process, or in Redis shared by gateways.

Never the durable store: presence is who is connected now. Each gateway writes, per thread, one
value holding all of its members there (a JSON object by member id, serialised by the gateway
when they change), and says it is alive with a beat that expires on its own (`beat`, every half
refresh interval). A gateway's values count only while its beat lasts, so the members of a
gateway that died vanish on their own and readers skip (and delete) them. While nothing
changes, what a gateway does per period is one beat and one liveness check of the gateways it
sees, whatever its connections and threads (`alive`); a value is rewritten only on a change
and when the gateway's beat had lapsed (Redis restarted, or the gateway stalled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from realtime.bus_errors import BusError
from realtime.channels import gateway_key, presence_key
from realtime.redis_urls import describe

log = logging.getLogger(__name__)

# One gateway's members of one thread, as written: a JSON object, member id -> entry.
Members = bytes


class PresenceStore(Protocol):
    """Per thread, each live gateway's members (`Members`, opaque here) by gateway id."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def write_many(self, values: Sequence[tuple[str, str, Members | None]]) -> None:
        """(thread id, gateway, members) each; None: the gateway has no member there now."""
        ...

    async def beat(self, gateway: str, ttl: float) -> bool:
        """`gateway` is alive for `ttl` more seconds; False if it was not alive until now
        (its first beat, or its last one expired, or the store lost it)."""
        ...

    async def alive(self, gateways: list[str]) -> set[str]:
        """Those of `gateways` whose beat has not expired."""
        ...

    async def touch(self, thread_ids: list[str]) -> None:
        """Keep the threads' values (a thread nobody writes or touches is forgotten)."""
        ...

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, Members]]:
        """Live gateways' members of every thread of `thread_ids` (by thread id, then by
        gateway), without gateway `skip`'s; in one round trip where the store has them, and
        one more for the liveness of the gateways found."""
        ...


class MemoryPresence:
    """The embedded setup: one process, so dicts are the shared truth."""

    def __init__(self) -> None:
        self._threads: dict[str, dict[str, Members]] = {}
        self._beats: dict[str, float] = {}  # gateway -> when its beat expires (time.time)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._threads.clear()
        self._beats.clear()

    async def write_many(self, values: Sequence[tuple[str, str, Members | None]]) -> None:
        for thread_id, gateway, members in values:
            if members is not None:
                self._threads.setdefault(thread_id, {})[gateway] = members
                continue
            written = self._threads.get(thread_id)
            if written is not None:
                written.pop(gateway, None)
                if not written:
                    del self._threads[thread_id]

    async def beat(self, gateway: str, ttl: float) -> bool:
        now = time.time()
        was_alive = self._beats.get(gateway, 0.0) > now
        self._beats[gateway] = now + ttl
        return was_alive

    async def alive(self, gateways: list[str]) -> set[str]:
        now = time.time()
        return {g for g in gateways if self._beats.get(g, 0.0) > now}

    async def touch(self, thread_ids: list[str]) -> None:
        return None

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, Members]]:
        found: dict[str, dict[str, Members]] = {}
        for thread_id in thread_ids:
            written = self._threads.get(thread_id, {})
            live = await self.alive(list(written))
            for gateway in [g for g in written if g not in live]:
                del written[gateway]
            found[thread_id] = {g: m for g, m in written.items() if g != skip}
        return found


# Presence commands in flight per process. redis-py refuses a command outright ("Too many
# connections") once its pool (100 connections by default, per node on a cluster) is busy; a
# burst of joins (thousands of websockets subscribing at once, each change reread by every
# gateway) queues here instead of failing.
MAX_IN_FLIGHT = 50


class RedisPresence:
    """One Redis hash per thread (`presence_key`: gateway -> members) and one expiring key per
    gateway (`gateway_key`). A thread's hash itself expires a while after it was last written
    or touched, so a thread nobody looks at any more leaves nothing behind."""

    def __init__(self, url: str, *, prefix: str = "threadline:", key_ttl: float = 60.0) -> None:
        self.url = url
        self.prefix = prefix
        self.key_ttl = max(1, math.ceil(key_ttl))
        self._client: Any = None
        self._gate = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def open(self) -> None:
        from realtime.redis_urls import command_client, initialize

        self._client = command_client(
            self.url, socket_timeout=5, socket_connect_timeout=5, client_name="threadline-presence"
        )
        try:
            await initialize(self._client)
        except Exception as exc:  # presence is best effort: a later call retries the load
            log.warning("presence: cannot load the cluster's slot map yet: %s", exc)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _key(self, thread_id: str) -> str:
        return self.prefix + presence_key(thread_id)

    def _alive_key(self, gateway: str) -> str:
        return self.prefix + gateway_key(gateway)

    async def write_many(self, values: Sequence[tuple[str, str, Members | None]]) -> None:
        if not values:
            return
        try:
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for thread_id, gateway, members in values:
                    key = self._key(thread_id)
                    if members is None:
                        pipe.hdel(key, gateway)
                    else:
                        pipe.hset(key, gateway, members)
                        pipe.expire(key, self.key_ttl)
                await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence write to {describe(self.url)} failed: {exc}") from exc

    async def beat(self, gateway: str, ttl: float) -> bool:
        try:
            async with self._gate:
                # SET ... GET: the previous value, None if the key had expired (or never was).
                previous = await self._client.set(
                    self._alive_key(gateway), b"1", px=max(1, int(ttl * 1000)), get=True
                )
        except Exception as exc:
            raise BusError(f"presence beat to {describe(self.url)} failed: {exc}") from exc
        return previous is not None

    async def alive(self, gateways: list[str]) -> set[str]:
        if not gateways:
            return set()
        try:
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for gateway in gateways:
                    pipe.exists(self._alive_key(gateway))
                replies = await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence liveness read failed: {exc}") from exc
        return {g for g, found in zip(gateways, replies, strict=True) if found}

    async def touch(self, thread_ids: list[str]) -> None:
        if not thread_ids:
            return
        try:
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for thread_id in thread_ids:
                    pipe.expire(self._key(thread_id), self.key_ttl)
                await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence touch failed: {exc}") from exc

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, Members]]:
        if not thread_ids:
            return {}
        try:
            # One pipeline (on a cluster: one per node, sent together) for every thread.
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for thread_id in thread_ids:
                    pipe.hgetall(self._key(thread_id))
                replies: list[dict[bytes, bytes]] = await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence read failed: {exc}") from exc
        skipped = skip.encode()
        written = [{g.decode(): m for g, m in raw.items() if g != skipped} for raw in replies]
        live = await self.alive(sorted({g for found in written for g in found}))
        dead = [
            (thread_id, g)
            for thread_id, found in zip(thread_ids, written, strict=True)
            for g in found
            if g not in live
        ]
        if dead:
            # Best effort: another reader or the key's own expiry cleans up otherwise.
            with contextlib.suppress(Exception):
                await self.write_many([(thread_id, g, None) for thread_id, g in dead])
        return {
            thread_id: {g: m for g, m in found.items() if g in live}
            for thread_id, found in zip(thread_ids, written, strict=True)
        }
