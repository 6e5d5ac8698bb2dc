"""Redis pub/sub bus: one pub/sub connection per process, reference-counted channels, reconnects."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Unpack

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from realtime.bus_errors import BusClosedError, BusUnavailableError
from realtime.bus_support import BusState, check_message, check_replay_bounds, redact_url
from realtime.publish_options import PublishBatch, PublishOptions, publish_batch
from realtime.redis_common import DEFAULT_REPLAY_TTL as DEFAULT_REPLAY_TTL
from realtime.redis_common import RedisBusCommon, RedisBusOptions
from realtime.redis_pipe import CommandPipe

log = logging.getLogger(__name__)
_OPEN = BusState.OPEN

# KEYS: the replay list, its byte total. ARGV: entry, max entries, max bytes (0: none), TTL
# (and, for a publish of one message with replay, the channel). A list of one entry is new (or
# was cleared or expired): its total restarts from that entry, so a stale total never outlives
# its list. The newest entry is never trimmed.
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
# A publish of one message with replay: the append above, then the publish, in one script (one
# round trip; its commands run in order, so the append precedes the publish).
_PUBLISH_REPLAYED = _APPEND + "return redis.call('PUBLISH', ARGV[5], ARGV[1])\n"
# The same on a cluster: a sharded publish, to the channel on the replay's slot (hash tag).
SPUBLISH_REPLAYED = _APPEND + "return redis.call('SPUBLISH', ARGV[5], ARGV[1])\n"
_PUBLISH_REPLAYED_SHA = hashlib.sha1(_PUBLISH_REPLAYED.encode()).hexdigest()
# Any other publish with replay: the append and the publish above for each entry in turn, then
# the `then` messages published and the buffer cleared, in one script. ARGV: max entries, max bytes
# (0: none), TTL, channel, the number of entries n, clear ('1' or '0'), the n entries, then
# channel, data pairs. When the buffer is cleared at the end the appends are skipped: a DEL
# after them leaves what it leaves without them (no reader sees inside a script).
_PUBLISH_REPLAYED_MANY = """
local limit = tonumber(ARGV[1])
local max_bytes = tonumber(ARGV[2])
local last = 6 + tonumber(ARGV[5])
local clear = ARGV[6] == '1'
for i = 7, last do
  local entry = ARGV[i]
  if not clear then
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
  end
  redis.call('PUBLISH', ARGV[4], entry)
end
if last > 6 and not clear then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
for i = last + 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
if clear then redis.call('DEL', KEYS[1]) end
return 0
"""
_PUBLISH_REPLAYED_MANY_SHA = hashlib.sha1(_PUBLISH_REPLAYED_MANY.encode()).hexdigest()


def pack_command(*args: bytes | str | int) -> bytes:
    """A command in the Redis protocol, the bytes redis-py's `Connection.pack_command` sends
    (strings UTF-8, integers in decimal), packed in one join instead of one per argument."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        elif not isinstance(arg, bytes):
            raise TypeError(f"cannot send {type(arg).__name__} to Redis")
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(parts)


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


class RedisBus(RedisBusCommon[Redis]):
    """Implements `realtime.bus.Bus` on Redis pub/sub (redis-py asyncio).

    A single pub/sub connection carries every channel this process listens to: a channel is
    SUBSCRIBEd once however many local subscriptions it has, and UNSUBSCRIBEd when the last
    leaves. A reader task dispatches messages to the local bounded queues. When the connection is
    lost the reader marks the bus unhealthy, reconnects with capped exponential backoff,
    resubscribes every channel, waits for Redis to confirm, marks the bus healthy and runs the
    reconnect listeners (gateways then tell clients to resync: whatever was published meanwhile
    is gone). Both connections are named `<name>-pubsub` / `<name>-cmd` (CLIENT SETNAME).
    """

    _log = log
    _backend = "Redis"
    _subscribe_command = "SUBSCRIBE"

    def __init__(
        self, url: str, prefix: str = "threadline:", **options: Unpack[RedisBusOptions]
    ) -> None:
        super().__init__(url, prefix, **options)
        self._pubsub_client: Redis | None = None
        self._pipe: CommandPipe | None = None  # publishes and replay appends, coalesced
        self._pubsub: PubSub | None = None
        self._remote: set[bytes] = set()  # SUBSCRIBE sent on the current connection
        self._confirmed: set[bytes] = set()  # ... and confirmed by Redis

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
        self._pipe = CommandPipe(self._client, timeout=self._command_timeout)
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
        self._opened()

    async def _close_clients(self) -> None:
        if self._pipe is not None:
            await self._pipe.close()
            self._pipe = None
        for client in (self._client, self._pubsub_client):
            if client is not None:
                with suppress(RedisError, OSError):
                    await client.aclose()
        self._client = self._pubsub_client = None

    # -- publishing and replay -------------------------------------------------------------

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        if options is None and isinstance(data, bytes):  # one plain message: the common case
            command = pack_command("PUBLISH", self.prefix + channel, data)
            await self._pipelined(command, None, "publish to %r", channel)
            return
        batch = publish_batch(channel, data, options)
        if batch is None:
            return
        if batch.replay is None:  # plain messages, several: the `publish_all` script
            await self.publish_all([(channel, item) for item in batch.items] + [*batch.then])
        elif batch.single:
            await self._publish_replayed(batch)
        else:
            await self._publish_replayed_many(batch)

    async def append_replay(
        self, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        check_replay_bounds(limit, max_bytes)
        # One script: append, trim by count and bytes, expire, atomically. The byte total lives
        # in a companion key (`<key>:bytes`) that expires with the list.
        keys = self._replay_keys(key)
        args = self._append_args(data, limit, max_bytes)
        command = pack_command("EVALSHA", _APPEND_REPLAY_SHA, 2, *keys, *args)
        await self._pipelined(command, _APPEND_REPLAY, "append to replay %r", key)

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        args: list[Any] = []
        for channel, data in messages:
            check_message(data)
            args += (self.prefix + channel, data)
        keys = [] if clear_key is None else [self.prefix + clear_key]
        command = pack_command("EVALSHA", _PUBLISH_ALL_SHA, len(keys), *keys, *args)
        await self._pipelined(command, _PUBLISH_ALL, "publish of %s messages", len(messages))

    async def _pipelined(
        self, command: bytes, script: str | None, what: str, *args: object
    ) -> None:
        """Send a packed command through the pipe (coalesced with every other command sent
        meanwhile; its deadline, queueing included, is the pipe's), Redis failures raised as
        `BusUnavailableError` (`what % args` names the operation: formatted only then). The
        EVALSHA of a `script` Redis has forgotten (restarted, SCRIPT FLUSH) loads it and is
        sent once more."""
        pipe = self._pipe
        if pipe is None or self._state is not _OPEN:
            raise BusClosedError(f"RedisBus is {self._state.value}, not open")
        try:
            try:
                await pipe.send(command)
            except NoScriptError:
                if script is None:
                    raise
                await pipe.send(pack_command("SCRIPT", "LOAD", script))
                await pipe.send(command)
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise BusUnavailableError(
                f"{what % args} failed ({type(exc).__name__}: {exc})"
            ) from exc

    async def _publish_replayed(self, batch: PublishBatch) -> None:
        assert batch.replay is not None
        replay = batch.replay
        full_key = self.prefix + replay.key
        max_bytes = 0 if replay.max_bytes is None else int(replay.max_bytes)
        # KEYS: the list and its byte total (`_replay_keys`); ARGV: `_append_args`, the channel.
        command = pack_command(
            "EVALSHA",
            _PUBLISH_REPLAYED_SHA,
            2,
            full_key,
            full_key + ":bytes",
            batch.items[0],
            int(replay.limit),
            max_bytes,
            self._replay_ttl,
            self.prefix + batch.channel,
        )
        await self._pipelined(
            command,
            _PUBLISH_REPLAYED,
            "publish to %r with replay %r",
            batch.channel,
            replay.key,
        )

    async def _publish_replayed_many(self, batch: PublishBatch) -> None:
        assert batch.replay is not None
        replay, items = batch.replay, batch.items
        following: list[Any] = []
        for then_channel, data in batch.then:
            following += (self.prefix + then_channel, data)
        limits = self._append_args(b"", replay.limit, replay.max_bytes)[1:]
        clear = 1 if batch.clear_key is not None else 0
        args = [*limits, self.prefix + batch.channel, len(items), clear, *items, *following]
        keys = self._replay_keys(replay.key)
        command = pack_command("EVALSHA", _PUBLISH_REPLAYED_MANY_SHA, 2, *keys, *args)
        await self._pipelined(
            command,
            _PUBLISH_REPLAYED_MANY,
            "publish of %s messages with replay %r",
            len(items) + len(batch.then),
            replay.key,
        )

    # -- subscriptions ---------------------------------------------------------------------

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

    def _is_confirmed(self, key: bytes) -> bool:
        return key in self._confirmed

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

    def _connected(self) -> bool:
        return self._pubsub is not None

    async def _reconnect(self) -> None:
        await self._await_confirmations(await self._connect_pubsub())

    def _resubscribed(self) -> str:
        return f"{len(self._remote)} channels resubscribed"

    async def _disconnect(self) -> None:
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

    async def _read_connected(self) -> None:
        assert self._pubsub is not None
        await self._read_pinging(
            self._pubsub, self._handle, "Redis did not answer PING on the pub/sub connection"
        )

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if kind == "message":
            data = message["data"]
            self._subscriptions.push(channel, data)
        elif kind == "subscribe":
            self._confirmed.add(channel)
            self._waiters.confirm(channel)
        elif kind == "unsubscribe":
            self._confirmed.discard(channel)
