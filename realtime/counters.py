"""Quota counters: token buckets and expiring connection sets, in Redis or in this process."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from realtime.bus_metrics import LIMITER_FALLBACKS, safe_add

log = logging.getLogger(__name__)


class Counters(Protocol):
    """What the server's limiter needs from a counter store (atomic per call)."""

    @property
    def shared(self) -> bool:
        """True while counts are shared with other processes (Redis reachable)."""
        ...

    async def take(self, key: str, rate: float, burst: float, cost: float = 1.0) -> float:
        """Take `cost` from the token bucket `key`: 0 if allowed, else seconds until it would be."""
        ...

    async def take_all(self, buckets: Sequence[Bucket], cost: float = 1.0) -> tuple[int, float]:
        """Take `cost` from every bucket (key, rate, burst) if each has it, else from none:
        (-1, 0.0) when taken, else the index of the first bucket short of it and the seconds
        until it would not be."""
        ...

    async def join(self, keys: Sequence[str], caps: Sequence[int], member: str, ttl: float) -> int:
        """Add `member` to every set of `keys` if none is at its cap; -1 on success, else the
        index of the first full set (nothing is added then). Members expire after `ttl`."""
        ...

    async def refresh(self, keys: Sequence[str], member: str, ttl: float) -> None: ...
    async def refresh_many(self, slots: Sequence[tuple[Sequence[str], str]], ttl: float) -> None:
        """`refresh(keys, member, ttl)` for every (keys, member) of `slots`, in as few round
        trips as the backend can (a gateway keeps every open connection's slot this way)."""
        ...

    async def leave(self, keys: Sequence[str], member: str) -> None: ...
    async def close(self) -> None: ...


# A token bucket as `take_all` names it: its key, its rate (per second) and its burst.
Bucket = tuple[str, float, float]


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class MemoryCounters:
    """Counters of this process only: what one gateway sees, exact for the embedded setup."""

    clock: Any = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _sets: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        return False

    async def take(self, key: str, rate: float, burst: float, cost: float = 1.0) -> float:
        return (await self.take_all(((key, rate, burst),), cost))[1]

    async def take_all(self, buckets: Sequence[Bucket], cost: float = 1.0) -> tuple[int, float]:
        now = self.clock()
        refilled: list[_Bucket] = []
        for index, (key, rate, burst) in enumerate(buckets):
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(burst, now)
                self._prune(now)
            bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
            bucket.at = now
            if bucket.tokens < cost:
                return index, (cost - bucket.tokens) / rate
            refilled.append(bucket)
        for bucket in refilled:
            bucket.tokens -= cost
        return -1, 0.0

    def _prune(self, now: float) -> None:
        # Buckets are created per token and scope: drop old full ones so the map stays small.
        if len(self._buckets) > 10_000:
            stale = [k for k, b in self._buckets.items() if now - b.at > 3600]
            for key in stale:
                del self._buckets[key]

    async def join(self, keys: Sequence[str], caps: Sequence[int], member: str, ttl: float) -> int:
        now = self.clock()
        for index, (key, cap) in enumerate(zip(keys, caps, strict=True)):
            members = self._live(key, now)
            if member not in members and len(members) >= cap:
                return index
        for key in keys:
            self._sets.setdefault(key, {})[member] = now + ttl
        return -1

    def _live(self, key: str, now: float) -> dict[str, float]:
        members = self._sets.get(key, {})
        for name in [m for m, expiry in members.items() if expiry <= now]:
            del members[name]
        return members

    async def refresh(self, keys: Sequence[str], member: str, ttl: float) -> None:
        now = self.clock()
        for key in keys:
            members = self._sets.get(key)
            if members is not None and member in members:
                members[member] = now + ttl

    async def refresh_many(self, slots: Sequence[tuple[Sequence[str], str]], ttl: float) -> None:
        expiry = self.clock() + ttl
        for keys, member in slots:
            for key in keys:
                members = self._sets.get(key)
                if members is not None and member in members:
                    members[member] = expiry

    async def leave(self, keys: Sequence[str], member: str) -> None:
        for key in keys:
            members = self._sets.get(key)
            if members is not None:
                members.pop(member, None)
                if not members:
                    del self._sets[key]

    async def close(self) -> None:
        return None


# Redis' own clock (TIME) so every gateway agrees on refills and expiries. ARGV: the cost, then
# each key's rate and burst. Every bucket refilled and checked first, then all taken or none
# (a bucket untouched is as if refilled: its state is its tokens at a time). A negative cost
# gives back (a cluster's refund, `RedisCounters.take_all`), never past the burst.
_TAKE_ALL = """
local cost = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local left = {}
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local v = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(v[1]) or burst
  local at = tonumber(v[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  if tokens < cost then return {i - 1, tostring((cost - tokens) / rate)} end
  left[i] = math.min(burst, tokens - cost)
end
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', tostring(left[i]), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil(burst / rate * 1000) + 1000)
end
return {-1, '0'}
"""

_JOIN = """
local member, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local full = redis.call('ZCARD', key) >= tonumber(ARGV[2 + i])
  if full and not redis.call('ZSCORE', key, member) then
    return i - 1
  end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + ttl, member)
  redis.call('PEXPIRE', key, ttl)
end
return -1
"""

_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', key, tonumber(ARGV[2]))
end
return 0
"""

# Many members at once (a gateway's connections, each period): ARGV is [ttl, then per member:
# its key count, the member]; each key is PEXPIREd once however many members it holds.
_REFRESH_MANY = """
local t = redis.call('TIME')
local ttl = tonumber(ARGV[1])
local score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl
local k, seen = 0, {}
for i = 2, #ARGV, 2 do
  for j = k + 1, k + tonumber(ARGV[i]) do
    redis.call('ZADD', KEYS[j], 'XX', score, ARGV[i + 1])
    if not seen[KEYS[j]] then
      seen[KEYS[j]] = true
      redis.call('PEXPIRE', KEYS[j], ttl)
    end
  end
  k = k + tonumber(ARGV[i])
end
return 0
"""
# Members per `_REFRESH_MANY` call: one call keeps Redis busy for about a millisecond.
REFRESH_CHUNK = 512

_LEAVE = """
for _, key in ipairs(KEYS) do
  redis.call('ZREM', key, ARGV[1])
end
return 0
"""


class RedisCounters:
    """Counters shared by every process on one Redis; this process's own counts when it is down.

    Every call is one Lua script (atomic, on Redis' clock). Concurrent calls are coalesced by a
    `Batcher`: what is queued goes as one script call that runs each in turn, with at most
    `senders` batches (connections) in flight. So a burst of thousands of calls (websockets
    connecting or closing at once) is counted in Redis exactly, in a few round trips, instead
    of asking for a connection each (the pool refused the 101st).

    A Redis failure never refuses a request by itself: the call falls back to `MemoryCounters`
    (per-gateway limits, so a cluster of N gateways admits up to N times a limit), is counted
    in `fallbacks` and the `threadline.realtime.limiter_fallbacks` metric, and logs once per
    outage; the next call tries Redis again. A batch that takes longer than `timeout` fails.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        timeout: float = 0.5,
        client_name: str = "threadline-limits",
        senders: int = 2,
    ) -> None:
        from realtime.redis_batch import Batcher  # scale-out only
        from realtime.redis_urls import command_client, is_cluster_url

        self.prefix = prefix
        self.fallback = MemoryCounters()
        self.fallbacks = 0  # calls counted by this process because Redis failed
        # On a cluster every call must name keys of one slot: the limiter tags them (join).
        self._client: Any = command_client(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            client_name=client_name,
        )
        self._cluster = is_cluster_url(url)
        self.batcher = Batcher(
            self._client, timeout=timeout, senders=senders, cluster=self._cluster
        )
        self._take_all = self.batcher.operation(_TAKE_ALL)
        self._join = self.batcher.operation(_JOIN)
        self._refresh = self.batcher.operation(_REFRESH)
        self._refresh_many = self.batcher.operation(_REFRESH_MANY)
        self._leave = self.batcher.operation(_LEAVE)
        self._degraded = False

    @property
    def shared(self) -> bool:
        return not self._degraded

    def _keys(self, keys: Sequence[str]) -> list[str]:
        full = [self.prefix + key for key in keys]
        # Raised, not counted as an outage: a cross-slot call would fail on every attempt and
        # silently leave the limits per gateway.
        if self._cluster and len(full) > 1 and not _one_slot(full):
            raise ValueError(f"keys {keys!r} must share a hash tag on a Redis Cluster")
        return full

    def _failed(self, exc: Exception) -> None:
        self.fallbacks += 1
        safe_add(LIMITER_FALLBACKS, 1, {"error": type(exc).__name__})
        if not self._degraded:
            log.warning(
                "quota counters fall back to this process (Redis: %s: %s)", type(exc).__name__, exc
            )
        self._degraded = True

    def _ok(self) -> None:
        if self._degraded:
            log.info("quota counters are shared through Redis again")
        self._degraded = False

    async def take(self, key: str, rate: float, burst: float, cost: float = 1.0) -> float:
        return (await self.take_all(((key, rate, burst),), cost))[1]

    async def take_all(self, buckets: Sequence[Bucket], cost: float = 1.0) -> tuple[int, float]:
        keys = [self.prefix + key for key, _, _ in buckets]
        try:
            if not self._cluster or len(keys) == 1 or _one_slot(keys):
                args: list[float] = [cost]
                for _, rate, burst in buckets:
                    args += (rate, burst)
                index, wait = await self.batcher.call(self._take_all, keys, args)
                answer = int(index), float(wait)
            else:
                answer = await self._take_each(keys, buckets, cost)
        except Exception as exc:  # any Redis failure: count locally instead
            self._failed(exc)
            return await self.fallback.take_all(buckets, cost)
        self._ok()
        return answer

    async def _take_each(
        self, keys: list[str], buckets: Sequence[Bucket], cost: float
    ) -> tuple[int, float]:
        """`take_all` over keys of several cluster slots: every bucket at once (one script per
        slot, concurrently), then what was taken given back when one was short."""

        def args(index: int, amount: float) -> list[float]:
            return [amount, buckets[index][1], buckets[index][2]]

        calls = [self.batcher.call(self._take_all, [k], args(i, cost)) for i, k in enumerate(keys)]
        replies = [(int(index), float(wait)) for index, wait in await asyncio.gather(*calls)]
        short = [(i, wait) for i, (index, wait) in enumerate(replies) if index >= 0]
        if not short:
            return -1, 0.0
        taken = [i for i, (index, _) in enumerate(replies) if index < 0]
        await asyncio.gather(
            *(self.batcher.call(self._take_all, [keys[i]], args(i, -cost)) for i in taken)
        )
        return short[0]

    async def join(self, keys: Sequence[str], caps: Sequence[int], member: str, ttl: float) -> int:
        # Joined locally too, so a Redis outage later still counts this connection.
        full_keys = self._keys(keys)
        local = await self.fallback.join(keys, caps, member, ttl)
        try:
            args: list[str | int] = [member, math.ceil(ttl * 1000), *caps]
            full = int(await self.batcher.call(self._join, full_keys, args))
        except Exception as exc:
            self._failed(exc)
            return local
        self._ok()
        if full >= 0 and local < 0:
            await self.fallback.leave(keys, member)
        return full

    async def refresh(self, keys: Sequence[str], member: str, ttl: float) -> None:
        full_keys = self._keys(keys)
        await self.fallback.refresh(keys, member, ttl)
        try:
            await self.batcher.call(self._refresh, full_keys, [member, math.ceil(ttl * 1000)])
        except Exception as exc:
            self._failed(exc)
            return
        self._ok()

    async def refresh_many(self, slots: Sequence[tuple[Sequence[str], str]], ttl: float) -> None:
        # One call of `_REFRESH_MANY` per REFRESH_CHUNK members (on a cluster, per hash slot of
        # their keys), all queued together: a few EVALSHA for every connection of a gateway,
        # and two arguments per member, not a call each. Each member's keys were checked to
        # share a slot when it joined.
        await self.fallback.refresh_many(slots, ttl)
        prefix, groups = self.prefix, self._refresh_groups(slots)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for group in groups:
            for start in range(0, len(group), REFRESH_CHUNK):
                keys: list[str] = []
                args: list[Any] = [math.ceil(ttl * 1000)]
                for member_keys, member in group[start : start + REFRESH_CHUNK]:
                    keys += [prefix + key for key in member_keys]
                    args += (len(member_keys), member)
                calls.append((keys, args))
        failures = [
            r for r in await self.batcher.call_many(self._refresh_many, calls) if r is not None
        ]
        if failures:
            self._failed(failures[0])
            return
        self._ok()

    def _refresh_groups(
        self, slots: Sequence[tuple[Sequence[str], str]]
    ) -> list[Sequence[tuple[Sequence[str], str]]]:
        """All of `slots`, or on a cluster those of one hash slot each (a script's keys)."""
        if not self._cluster:
            return [slots]
        from redis.crc import key_slot

        groups: dict[int, list[tuple[Sequence[str], str]]] = {}
        for keys, member in slots:
            slot = key_slot((self.prefix + keys[0]).encode()) if keys else 0
            groups.setdefault(slot, []).append((keys, member))
        return list(groups.values())

    async def leave(self, keys: Sequence[str], member: str) -> None:
        full_keys = self._keys(keys)
        await self.fallback.leave(keys, member)
        try:
            await self.batcher.call(self._leave, full_keys, [member])
        except Exception as exc:
            self._failed(exc)
            return
        self._ok()

    async def close(self) -> None:
        await self.batcher.close()
        await self._client.aclose()


def _one_slot(keys: Sequence[str]) -> bool:
    from redis.crc import key_slot

    return len({key_slot(key.encode()) for key in keys}) == 1


def open_counters(redis_url: str | None, prefix: str) -> Counters:
    """Redis counters when Redis is configured, else this process's."""
    if not redis_url:
        return MemoryCounters()
    return RedisCounters(redis_url, prefix)


__all__ = ["Bucket", "Counters", "MemoryCounters", "RedisCounters", "open_counters"]
