"""Ephemeral presence entries per thread with expiry: in process, or in Redis shared by gateways.

Never the durable store: presence is who is connected now. Each entry carries its own expiry
(`expires_at`, seconds since the epoch); a gateway refreshes its entries periodically, so the
entries of a gateway that died expire on their own and readers skip (and delete) them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any, Protocol

import orjson

from realtime.bus_errors import BusError
from realtime.channels import presence_key
from realtime.redis_urls import describe

log = logging.getLogger(__name__)


class PresenceStore(Protocol):
    """Entries of a thread by member id (a connection), each a JSON object with `expires_at`."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def put(self, thread_id: str, member_id: str, entry: dict[str, Any]) -> None: ...
    async def put_many(self, entries: list[tuple[str, str, dict[str, Any]]]) -> None: ...
    async def remove(self, thread_id: str, member_id: str) -> None: ...
    async def read(self, thread_id: str, skip: str = "") -> dict[str, dict[str, Any]]:
        """Live entries by member id, without those whose id starts with `skip` (if given)."""
        ...

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """`read` of every thread of `thread_ids` (by thread id), in one round trip where the
        store has them (a gateway rereads all its threads this way every half interval)."""
        ...


def _live(entries: dict[str, dict[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in entries.items() if float(v.get("expires_at", 0)) > now}


class MemoryPresence:
    """The embedded setup: one process, so a dict is the shared truth."""

    def __init__(self) -> None:
        self._threads: dict[str, dict[str, dict[str, Any]]] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._threads.clear()

    async def put(self, thread_id: str, member_id: str, entry: dict[str, Any]) -> None:
        self._threads.setdefault(thread_id, {})[member_id] = dict(entry)

    async def put_many(self, entries: list[tuple[str, str, dict[str, Any]]]) -> None:
        for thread_id, member_id, entry in entries:
            await self.put(thread_id, member_id, entry)

    async def remove(self, thread_id: str, member_id: str) -> None:
        members = self._threads.get(thread_id)
        if members is not None:
            members.pop(member_id, None)
            if not members:
                del self._threads[thread_id]

    async def read(self, thread_id: str, skip: str = "") -> dict[str, dict[str, Any]]:
        live = _live(self._threads.get(thread_id, {}), time.time())
        if live:
            self._threads[thread_id] = dict(live)
        else:
            self._threads.pop(thread_id, None)
        if skip:
            return {k: v for k, v in live.items() if not k.startswith(skip)}
        return live

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, dict[str, Any]]]:
        return {thread_id: await self.read(thread_id, skip) for thread_id in thread_ids}


# Presence commands in flight per process. redis-py refuses a command outright ("Too many
# connections") once its pool (100 connections by default, per node on a cluster) is busy; a
# burst of joins (thousands of websockets subscribing at once, each change reread by every
# gateway) queues here instead of failing.
MAX_IN_FLIGHT = 50


class RedisPresence:
    """One Redis hash per thread. The key itself expires a while after its last write, so a
    thread nobody looks at any more leaves nothing behind."""

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

    async def put(self, thread_id: str, member_id: str, entry: dict[str, Any]) -> None:
        await self.put_many([(thread_id, member_id, entry)])

    async def put_many(self, entries: list[tuple[str, str, dict[str, Any]]]) -> None:
        if not entries:
            return
        try:
            # One HSET and one EXPIRE per thread, however many of its members are written
            # (a refresh writes every member of this gateway).
            by_key: dict[str, dict[str, bytes]] = {}
            for thread_id, member_id, entry in entries:
                by_key.setdefault(self._key(thread_id), {})[member_id] = orjson.dumps(entry)
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for key, fields in by_key.items():
                    pipe.hset(key, mapping=fields)
                    pipe.expire(key, self.key_ttl)
                await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence write to {describe(self.url)} failed: {exc}") from exc

    async def remove(self, thread_id: str, member_id: str) -> None:
        try:
            async with self._gate:
                await self._client.hdel(self._key(thread_id), member_id)
        except Exception as exc:
            raise BusError(f"presence delete failed: {exc}") from exc

    async def read(self, thread_id: str, skip: str = "") -> dict[str, dict[str, Any]]:
        try:
            async with self._gate:
                raw = await self._client.hgetall(self._key(thread_id))
        except Exception as exc:
            raise BusError(f"presence read failed: {exc}") from exc
        return await self._entries(thread_id, raw, skip)

    async def read_many(
        self, thread_ids: list[str], skip: str = ""
    ) -> dict[str, dict[str, dict[str, Any]]]:
        if not thread_ids:
            return {}
        try:
            # One pipeline (on a cluster: one per node, sent together) for every thread.
            async with self._gate, self._client.pipeline(transaction=False) as pipe:
                for thread_id in thread_ids:
                    pipe.hgetall(self._key(thread_id))
                replies = await pipe.execute()
        except Exception as exc:
            raise BusError(f"presence read failed: {exc}") from exc
        return {
            thread_id: await self._entries(thread_id, raw, skip)
            for thread_id, raw in zip(thread_ids, replies, strict=True)
        }

    async def _entries(
        self, thread_id: str, raw: dict[bytes, bytes], skip: str
    ) -> dict[str, dict[str, Any]]:
        """The live entries of one HGETALL reply; expired ones are deleted (best effort)."""
        entries: dict[str, dict[str, Any]] = {}
        skipped = skip.encode()
        for member_id, data in raw.items():
            if skipped and member_id.startswith(skipped):
                continue
            try:
                entry = orjson.loads(data)
                if isinstance(entry, dict):
                    entries[member_id.decode()] = entry
            except (orjson.JSONDecodeError, UnicodeDecodeError):
                continue
        live = _live(entries, time.time())
        expired = [member_id for member_id in entries if member_id not in live]
        if expired:
            # Best effort: another reader or the key's own expiry cleans up otherwise.
            with contextlib.suppress(Exception):
                async with self._gate:
                    await self._client.hdel(self._key(thread_id), *expired)
        return live
