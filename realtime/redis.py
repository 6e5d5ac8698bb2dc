"""Redis pub/sub bus: one pub/sub connection per process, reference-counted channels, reconnects."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from realtime.base import (
    DEFAULT_MAX_QUEUE,
    AsyncResource,
    BusState,
    LocalSubscriptions,
    QueueSubscription,
    ReconnectListener,
    ReconnectListeners,
    cancel_and_wait,
    check_replay_bounds,
    redact_url,
)
from realtime.errors import BusClosedError, BusUnavailableError
from realtime.telemetry import RECONNECTS, safe_add

log = logging.getLogger(__name__)

DEFAULT_REPLAY_TTL = 3600

# KEYS: the replay list, its byte total. ARGV: entry, max entries, max bytes (0: none), TTL
# (and, for `publish_replayed`, the channel). A list of one entry is new (or was cleared or
# expired): its total restarts from that entry, so a stale total never outlives its list. The
# newest entry is never trimmed.
_APPEND = """
local count = redis.call('RPUSH', KEYS[1], ARGV[1])
local size
if count == 1 then
  size = string.len(ARGV[1])
  redis.call('SET', KEYS[2], size)
else
  size = redis.call('INCRBY', KEYS[2], string.len(ARGV[1]))
end
local limit = tonumber(ARGV[2])
local max_bytes = tonumber(ARGV[3])
while count > 1 and (count > limit or (max_bytes > 0 and size > max_bytes)) do
  size = redis.call('DECRBY', KEYS[2], string.len(redis.call('LPOP', KEYS[1])))
  count = count - 1
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
"""
APPEND_REPLAY = _APPEND + "return size\n"
_APPEND_REPLAY = APPEND_REPLAY
_APPEND_REPLAY_SHA = hashlib.sha1(_APPEND_REPLAY.encode()).hexdigest()
# `publish_replayed`: the append above, then the publish, in one script (one round trip; its
# commands run in order, so the append precedes the publish).
_PUBLISH_REPLAYED = _APPEND + "return redis.call('PUBLISH', ARGV[5], ARGV[1])\n"
# The same on a cluster: a sharded publish, to the channel on the replay's slot (hash tag).
SPUBLISH_REPLAYED = _APPEND + "return redis.call('SPUBLISH', ARGV[5], ARGV[1])\n"
_PUBLISH_REPLAYED_SHA = hashlib.sha1(_PUBLISH_REPLAYED.encode()).hexdigest()
# `publish_replayed_many`: the append and the publish above for each entry in turn, in one
# script. ARGV: max entries, max bytes (0: none), TTL, channel, then the entries.
_PUBLISH_REPLAYED_MANY = """
local limit = tonumber(ARGV[1])
local max_bytes = tonumber(ARGV[2])
for i = 5, #ARGV do
  local entry = ARGV[i]
  local count = redis.call('RPUSH', KEYS[1], entry)
  local size
  if count == 1 then
    size = string.len(entry)
    redis.call('SET', KEYS[2], size)
  else
    size = redis.call('INCRBY', KEYS[2], string.len(entry))
  end
  while count > 1 and (count > limit or (max_bytes > 0 and size > max_bytes)) do
    size = redis.call('DECRBY', KEYS[2], string.len(redis.call('LPOP', KEYS[1])))
    count = count - 1
  end
  redis.call('PUBLISH', ARGV[4], entry)
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 0
"""
_PUBLISH_REPLAYED_MANY_SHA = hashlib.sha1(_PUBLISH_REPLAYED_MANY.encode()).hexdigest()


def replay_script_keys(full_key: str) -> list[str]:
    """KEYS of the replay scripts: the list and its byte total (one hash tag, one slot)."""
    return [full_key, full_key + ":bytes"]


def replay_script_args(data: bytes, limit: int, max_bytes: int | None, ttl: int) -> list[Any]:
    """The first ARGV of the replay scripts: entry, max entries, max bytes (0: none), TTL."""
    return [data, int(limit), 0 if max_bytes is None else int(max_bytes), ttl]


async def _close_quietly(pubsub: PubSub) -> None:
    with suppress(Exception):
        await pubsub.aclose()


# `publish_all`: ARGV channel, data, channel, data, ...; then delete KEYS[1] when given.
_PUBLISH_ALL = """
for i = 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
if #KEYS > 0 then redis.call('DEL', KEYS[1]) end
return 0
"""
_PUBLISH_ALL_SHA = hashlib.sha1(_PUBLISH_ALL.encode()).hexdigest()

class RedisBus(AsyncResource):
    """Implements `realtime.bus.Bus` on Redis pub/sub (redis-py asyncio).

    A single pub/sub connection carries every channel this process listens to: a channel is
    SUBSCRIBEd once however many local subscriptions it has, and UNSUBSCRIBEd when the last
    leaves. A reader task dispatches messages to the local bounded queues. When the connection is
    lost the reader marks the bus unhealthy, reconnects with capped exponential backoff,
    resubscribes every channel, waits for Redis to confirm, marks the bus healthy and runs the
    reconnect listeners (gateways then tell clients to resync: whatever was published meanwhile
    is gone). Both connections are named `<name>-pubsub` / `<name>-cmd` (CLIENT SETNAME).
    """

    def __init__(
        self,
        url: str,
        prefix: str = "threadline:",
        *,
        name: str | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        replay_ttl: int = DEFAULT_REPLAY_TTL,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
        ping_interval: float = 5.0,
        subscribe_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        command_timeout: float = 5.0,
    ) -> None:
        self._url = url
        self.prefix = prefix
        self._prefix_bytes = prefix.encode()
        self.name = name or f"threadline-{uuid.uuid4().hex[:8]}"
        self._replay_ttl = replay_ttl
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._ping_interval = ping_interval
        self._subscribe_timeout = subscribe_timeout
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._state = BusState.NEW
        self._healthy = False
        self._client: Redis | None = None
        self._pubsub_client: Redis | None = None
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        # Serialises changes of the pub/sub connection and the SUBSCRIBE/UNSUBSCRIBE commands
        # sent on it, so a reconnect never races a channel change. Reading holds no lock.
        self._lock = asyncio.Lock()
        self._subscriptions: LocalSubscriptions[bytes] = LocalSubscriptions(max_queue)
        self._remote: set[bytes] = set()  # SUBSCRIBE sent on the current connection
        self._confirmed: set[bytes] = set()  # ... and confirmed by Redis
        self._waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self._listeners = ReconnectListeners()

    @property
    def pubsub_client_name(self) -> str:
        return f"{self.name}-pubsub"

    @property
    def command_client_name(self) -> str:
        return f"{self.name}-cmd"

    @property
    def healthy(self) -> bool:
        return self._healthy

    def add_reconnect_listener(self, callback: ReconnectListener) -> None:
        """Run `callback()` (sync or async) after every successful reconnect and resubscribe."""
        self._listeners.add(callback)

    def remove_reconnect_listener(self, callback: ReconnectListener) -> None:
        self._listeners.remove(callback)

    def subscriber_count(self, channel: str) -> int:
        """Local subscriptions of `channel` in this process (Redis sees at most one)."""
        return self._subscriptions.count(self._prefix_bytes + channel.encode())

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect both connections; raises `BusUnavailableError` if Redis cannot be reached."""
        if self._state is not BusState.NEW:
            raise BusClosedError(f"RedisBus is {self._state.value}; it can be opened once")
        common: dict[str, Any] = {
            "socket_connect_timeout": self._connect_timeout,
            "socket_keepalive": True,
            # No socket timeout: with one, redis-py wraps every send in asyncio.wait_for, which
            # on Python 3.11 can swallow a cancellation. Deadlines are ours (asyncio.timeout).
            "socket_timeout": None,
        }
        self._client = Redis.from_url(
            self._url,
            client_name=self.command_client_name,
            # One retry covers a pooled connection that died while idle (e.g. Redis restarted).
            retry=Retry(NoBackoff(), 1),
            **common,
        )
        self._pubsub_client = Redis.from_url(
            self._url,
            client_name=self.pubsub_client_name,
            # No retry at all: redis-py would otherwise reconnect and resubscribe silently, and
            # we would never learn that messages were lost.
            retry=Retry(NoBackoff(), 0, supported_errors=()),
            **common,
        )
        try:
            async with asyncio.timeout(self._connect_timeout + self._command_timeout):
                await self._client.ping()
                await self._connect_pubsub()
        except (RedisError, OSError) as exc:
            await self._close_clients()  # state stays NEW: open() may be retried
            raise BusUnavailableError(
                f"cannot reach Redis at {redact_url(self._url)}: {exc}"
            ) from exc
        self._state = BusState.OPEN
        self._healthy = True
        self._reader = asyncio.create_task(self._read_forever(), name=f"{self.name}-reader")

    async def close(self) -> None:
        """Ordered shutdown: reader task, pub/sub connection, local subscriptions, clients."""
        if self._state is BusState.CLOSED:
            return
        self._state = BusState.CLOSED
        self._healthy = False
        if self._reader is not None:
            await cancel_and_wait(self._reader)
            self._reader = None
        await self._drop_pubsub()
        self._subscriptions.close_all()
        self._release_waiters()
        await self._close_clients()

    async def _close_clients(self) -> None:
        for client in (self._client, self._pubsub_client):
            if client is not None:
                with suppress(RedisError, OSError):
                    await client.aclose()
        self._client = self._pubsub_client = None

    def _require_open(self) -> Redis:
        if self._state is not BusState.OPEN or self._client is None:
            raise BusClosedError(f"RedisBus is {self._state.value}, not open")
        return self._client

    # -- publishing and replay -------------------------------------------------------------

    @asynccontextmanager
    async def _command(self, what: str) -> AsyncIterator[Redis]:
        """The command client, with our deadline and Redis failures as `BusUnavailableError`."""
        client = self._require_open()
        try:
            async with asyncio.timeout(self._command_timeout):
                yield client
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise BusUnavailableError(f"{what} failed ({type(exc).__name__}: {exc})") from exc

    async def publish(self, channel: str, data: bytes) -> None:
        if not isinstance(data, bytes):
            raise TypeError(f"bus messages are bytes, got {type(data).__name__}")
        async with self._command(f"publish to {channel!r}") as client:
            await client.publish(self.prefix + channel, data)

    async def append_replay(
        self, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        check_replay_bounds(limit, max_bytes)
        # One script: append, trim by count and bytes, expire, atomically. The byte total lives
        # in a companion key (`<key>:bytes`) that expires with the list.
        async with self._command(f"append to replay {key!r}") as client:
            await self._script(
                client,
                _APPEND_REPLAY,
                _APPEND_REPLAY_SHA,
                self._replay_keys(key),
                self._append_args(data, limit, max_bytes),
            )

    def _replay_keys(self, key: str) -> list[str]:
        return replay_script_keys(self.prefix + key)

    def _append_args(self, data: bytes, limit: int, max_bytes: int | None) -> list[Any]:
        return replay_script_args(data, limit, max_bytes, self._replay_ttl)

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        args: list[Any] = []
        for channel, data in messages:
            if not isinstance(data, bytes):
                raise TypeError(f"bus messages are bytes, got {type(data).__name__}")
            args += (self.prefix + channel, data)
        keys = [] if clear_key is None else [self.prefix + clear_key]
        async with self._command(f"publish of {len(messages)} messages") as client:
            await self._script(client, _PUBLISH_ALL, _PUBLISH_ALL_SHA, keys, args)

    async def _script(
        self, client: Redis, script: str, sha: str, keys: list[str], args: list[Any]
    ) -> None:
        try:
            await client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted (or flushed) Redis: load the script again
            await client.script_load(script)
            await client.evalsha(sha, len(keys), *keys, *args)

    async def publish_replayed(
        self, channel: str, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        if not isinstance(data, bytes):
            raise TypeError(f"bus messages are bytes, got {type(data).__name__}")
        check_replay_bounds(limit, max_bytes)
        args = [*self._append_args(data, limit, max_bytes), self.prefix + channel]
        async with self._command(f"publish to {channel!r} with replay {key!r}") as client:
            await self._script(
                client, _PUBLISH_REPLAYED, _PUBLISH_REPLAYED_SHA, self._replay_keys(key), args
            )

    async def publish_replayed_many(
        self,
        channel: str,
        key: str,
        items: Sequence[bytes],
        limit: int,
        max_bytes: int | None = None,
    ) -> None:
        for data in items:
            if not isinstance(data, bytes):
                raise TypeError(f"bus messages are bytes, got {type(data).__name__}")
        check_replay_bounds(limit, max_bytes)
        if not items:
            return
        limits = replay_script_args(b"", limit, max_bytes, self._replay_ttl)[1:]
        args = [*limits, self.prefix + channel, *items]
        async with self._command(f"publish of {len(items)} to {channel!r} with replay") as client:
            await self._script(
                client,
                _PUBLISH_REPLAYED_MANY,
                _PUBLISH_REPLAYED_MANY_SHA,
                self._replay_keys(key),
                args,
            )

    async def read_replay(self, key: str) -> list[bytes]:
        async with self._command(f"read of replay {key!r}") as client:
            items = await client.lrange(self.prefix + key, 0, -1)
        return cast(list[bytes], items)  # no decode_responses: always bytes

    async def clear_replay(self, key: str) -> None:
        async with self._command(f"clear of replay {key!r}") as client:
            await client.delete(self.prefix + key)

    # -- subscriptions ---------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[QueueSubscription]:
        """Works while Redis is down too: the channel is subscribed when the connection is back."""
        self._require_open()
        key = self._prefix_bytes + channel.encode()
        subscription = self._subscriptions.add(key, channel)
        try:
            await self._sync_channels()
            await self._wait_confirmed(key)
            yield subscription
        finally:
            self._subscriptions.remove(key, subscription)
            if self._state is BusState.OPEN:
                await self._sync_channels()

    async def _sync_channels(self) -> None:
        """Make the connection's channels match the local subscriptions."""
        broken: PubSub | None = None
        async with self._lock:
            pubsub = self._pubsub
            if pubsub is None:
                return  # the reconnect subscribes everything
            wanted = self._subscriptions.keys()
            added, removed = wanted - self._remote, self._remote - wanted
            try:
                if added:
                    self._remote |= added
                    await pubsub.subscribe(*added)
                if removed:
                    self._remote -= removed
                    self._confirmed -= removed
                    await pubsub.unsubscribe(*removed)
            except (RedisError, OSError) as exc:
                log.warning("Redis pub/sub command failed, forcing a reconnect: %s", exc)
                broken = pubsub
        if broken is not None:
            # Closing the connection makes the reader's next read fail, so the usual reconnect
            # path resubscribes everything; we never keep a half-subscribed connection.
            await _close_quietly(broken)

    async def _wait_confirmed(self, key: bytes) -> None:
        # Only a confirmed SUBSCRIBE guarantees that a publish made right after `subscribe()`
        # returns reaches us: publishers use other connections.
        if self._pubsub is None or key in self._confirmed:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(key, [])
        waiters.append(future)
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that races the
            # confirmation, leaving a cancelled caller running.
            async with asyncio.timeout(self._subscribe_timeout):
                await future
        except TimeoutError:
            log.warning("no SUBSCRIBE confirmation for %r yet; continuing", key)
        finally:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop(key, None)

    def _release_waiters(self) -> None:
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._waiters.clear()

    # -- the pub/sub connection ------------------------------------------------------------

    async def _connect_pubsub(self) -> PubSub:
        assert self._pubsub_client is not None
        async with self._lock:
            pubsub = self._pubsub_client.pubsub()
            channels = list(self._subscriptions.keys())
            try:
                await pubsub.connect()
                if channels:
                    await pubsub.subscribe(*channels)
            except BaseException:
                await _close_quietly(pubsub)
                raise
            self._pubsub = pubsub
            self._remote = set(channels)
            self._confirmed = set()
            return pubsub

    async def _drop_pubsub(self) -> None:
        async with self._lock:
            pubsub, self._pubsub = self._pubsub, None
            self._remote.clear()
            self._confirmed.clear()
        if pubsub is not None:
            await _close_quietly(pubsub)

    async def _await_confirmations(self, pubsub: PubSub) -> None:
        """Dispatch until Redis confirmed every channel (the caller bounds the time)."""
        while not self._remote <= self._confirmed:
            message = await pubsub.get_message(timeout=self._subscribe_timeout)
            if message is not None:
                self._handle(message)

    async def _read_forever(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self._min_backoff
        pubsub = self._pubsub
        connected_at = loop.time()
        while True:
            if pubsub is None:
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter spreads a herd
                delay = min(delay * 2, self._max_backoff)
                try:
                    async with asyncio.timeout(self._connect_timeout + self._subscribe_timeout):
                        pubsub = await self._connect_pubsub()
                        await self._await_confirmations(pubsub)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.debug("Redis reconnect failed: %s", exc)
                    await self._drop_pubsub()
                    pubsub = None
                    continue
                connected_at = loop.time()
                self._healthy = True
                safe_add(RECONNECTS, 1)
                log.info("Redis pub/sub reconnected; %d channels resubscribed", len(self._remote))
                await self._listeners.notify()
            try:
                await self._read(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Any failure, even an unexpected one, is handled as a lost connection: a dead
                # reader would silently stop all live delivery of this process.
                log.warning("Redis pub/sub connection lost (%s: %s)", type(exc).__name__, exc)
                self._healthy = False
                self._release_waiters()
                await self._drop_pubsub()
                pubsub = None
                if loop.time() - connected_at >= self._max_backoff:
                    delay = self._min_backoff  # a long-lived connection: start over quickly

    async def _read(self, pubsub: PubSub) -> None:
        """Dispatch messages until the connection fails; a PING probes a silent connection."""
        loop = asyncio.get_running_loop()
        last_seen = loop.time()
        ping_sent: float | None = None
        while True:
            message = await pubsub.get_message(timeout=self._ping_interval)
            now = loop.time()
            if message is not None:
                last_seen, ping_sent = now, None
                self._handle(message)
            elif ping_sent is not None:
                if now - ping_sent >= self._ping_interval:
                    raise TimeoutError("Redis did not answer PING on the pub/sub connection")
            elif now - last_seen >= self._ping_interval:
                await pubsub.ping()
                ping_sent = now

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if kind == "message":
            data = message["data"]
            self._subscriptions.push(channel, data)
        elif kind == "subscribe":
            self._confirmed.add(channel)
            for future in self._waiters.pop(channel, ()):
                if not future.done():
                    future.set_result(None)
        elif kind == "unsubscribe":
            self._confirmed.discard(channel)
