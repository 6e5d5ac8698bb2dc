"""What `RedisBus` and `RedisClusterBus` share: options, lifecycle, subscribe, the reconnect loop.

A subclass owns its connections: how to connect and resubscribe (`_reconnect`), to drop them
(`_disconnect`), to read them until one fails (`_read_connected`), and whether a channel's
subscription is confirmed. Everything around that is here, once.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Generic, TypedDict, TypeVar, cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from realtime.bus_errors import BusClosedError, BusUnavailableError
from realtime.bus_metrics import RECONNECTS, safe_add
from realtime.bus_support import (
    DEFAULT_MAX_QUEUE,
    AsyncResource,
    BusState,
    ConfirmationWaiters,
    LocalSubscriptions,
    QueueSubscription,
    ReconnectListener,
    ReconnectListeners,
    cancel_and_wait,
)

DEFAULT_REPLAY_TTL = 3600
# At most this many bus commands at once per bus: fewer than a pool's connections, which the
# connection checks and the cluster's slot refreshes share.
COMMANDS_IN_FLIGHT = 64

ClientT = TypeVar("ClientT", Redis, RedisCluster)


class _Probe:
    """What a pub/sub reader and its PING watchdog share: when the reader last got anything,
    and why the watchdog failed it."""

    __slots__ = ("failure", "seen")

    def __init__(self, seen: float) -> None:
        self.seen = seen
        self.failure: BaseException | None = None


class RedisBusOptions(TypedDict, total=False):
    """The keyword options of both Redis buses (defaults: `RedisBusCommon.__init__`)."""

    name: str | None
    max_queue: int
    replay_ttl: int
    min_backoff: float
    max_backoff: float
    ping_interval: float
    subscribe_timeout: float
    connect_timeout: float
    command_timeout: float


class RedisBusCommon(AsyncResource, Generic[ClientT]):
    """The part of a Redis bus that does not depend on how its pub/sub is connected."""

    _log: ClassVar[logging.Logger]  # the subclass's module logger
    _backend: ClassVar[str]  # "Redis", "Redis Cluster": for log messages
    _subscribe_command: ClassVar[str]  # "SUBSCRIBE", "SSUBSCRIBE": for log messages

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
        self._client: ClientT | None = None  # commands (publish, replay)
        # Commands at once: a worker streaming hundreds of runs has more publishes in flight
        # than redis-py's pools hold connections (100 per node), and a pool that has none free
        # refuses the command (`Too many connections`) instead of waiting. The rest wait here.
        self._in_flight = asyncio.Semaphore(COMMANDS_IN_FLIGHT)
        self._reader: asyncio.Task[None] | None = None
        # Serialises changes of the pub/sub connection(s) and the (un)subscribe commands sent
        # on them, so a reconnect never races a channel change. Reading holds no lock.
        self._lock = asyncio.Lock()
        self._subscriptions: LocalSubscriptions[bytes] = LocalSubscriptions(max_queue)
        self._waiters = ConfirmationWaiters()
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

    # -- what a subclass provides ----------------------------------------------------------

    @abc.abstractmethod
    def _connected(self) -> bool:
        """Whether the pub/sub connection(s) are up (else the reader is reconnecting)."""

    @abc.abstractmethod
    def _is_confirmed(self, key: bytes) -> bool:
        """Whether the server confirmed the subscription of `key` on the current connection."""

    @abc.abstractmethod
    async def _sync_channels(self) -> None:
        """Make the subscribed channels match the local subscriptions."""

    @abc.abstractmethod
    async def _reconnect(self) -> None:
        """Connect, resubscribe every channel and wait until the server confirmed them."""

    @abc.abstractmethod
    async def _disconnect(self) -> None:
        """Close the pub/sub connection(s) and forget their channels."""

    @abc.abstractmethod
    async def _read_connected(self) -> None:
        """Dispatch messages until a connection fails; that failure is raised."""

    @abc.abstractmethod
    def _resubscribed(self) -> str:
        """What a reconnect restored, for the log ("12 channels resubscribed")."""

    @abc.abstractmethod
    async def _close_clients(self) -> None:
        """Close the command client (and whatever else `close` leaves open)."""

    # -- lifecycle -------------------------------------------------------------------------

    def _opened(self) -> None:
        """The end of a successful `open()`: healthy, and the reader started."""
        self._state = BusState.OPEN
        self._healthy = True
        self._reader = asyncio.create_task(self._read_forever(), name=f"{self.name}-reader")

    async def close(self) -> None:
        """Ordered shutdown: reader task, pub/sub connection(s), local subscriptions, clients."""
        if self._state is BusState.CLOSED:
            return
        self._state = BusState.CLOSED
        self._healthy = False
        if self._reader is not None:
            await cancel_and_wait(self._reader)
            self._reader = None
        await self._disconnect()
        self._subscriptions.close_all()
        self._waiters.release_all()
        await self._close_clients()

    def _require_open(self) -> ClientT:
        if self._state is not BusState.OPEN or self._client is None:
            raise BusClosedError(f"{type(self).__name__} is {self._state.value}, not open")
        return self._client

    @asynccontextmanager
    async def _command(self, what: str, *args: object) -> AsyncIterator[ClientT]:
        """The command client, with our deadline and Redis failures as `BusUnavailableError`
        (`what % args` names the operation in it: formatted only then, not on every call)."""
        client = self._require_open()
        try:
            # Waiting for a turn counts against the deadline, as the command itself does.
            async with asyncio.timeout(self._command_timeout), self._in_flight:
                yield client
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise BusUnavailableError(
                f"{what % args} failed ({type(exc).__name__}: {exc})"
            ) from exc

    # -- replay ----------------------------------------------------------------------------

    def _replay_keys(self, key: str) -> list[str]:
        """KEYS of the replay scripts: the list and its byte total (one hash tag, one slot)."""
        full_key = self.prefix + key
        return [full_key, full_key + ":bytes"]

    def _append_args(self, data: bytes, limit: int, max_bytes: int | None) -> list[Any]:
        """The first ARGV of the replay scripts: entry, max entries, max bytes (0: none), TTL."""
        return [data, int(limit), 0 if max_bytes is None else int(max_bytes), self._replay_ttl]

    async def read_replay(self, key: str) -> list[bytes]:
        async with self._command("read of replay %r", key) as client:
            items = await client.lrange(self.prefix + key, 0, -1)
        return cast(list[bytes], items)  # no decode_responses: always bytes

    async def clear_replay(self, key: str) -> None:
        async with self._command("clear of replay %r", key) as client:
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

    async def _wait_confirmed(self, key: bytes) -> None:
        # Only a confirmed subscription guarantees that a publish made right after
        # `subscribe()` returns reaches us: publishers use other connections.
        if not self._connected() or self._is_confirmed(key):
            return
        if not await self._waiters.wait(key, self._subscribe_timeout):
            self._log.warning(
                "no %s confirmation for %r yet; continuing", self._subscribe_command, key
            )

    # -- the reader ------------------------------------------------------------------------

    async def _read_forever(self) -> None:
        """Read; on any failure: unhealthy, reconnect with capped exponential backoff and
        jitter, resubscribe, wait for confirmations, healthy, run the reconnect listeners."""
        loop = asyncio.get_running_loop()
        delay = self._min_backoff
        connected_at = loop.time()
        while True:
            if not self._connected():
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter spreads a herd
                delay = min(delay * 2, self._max_backoff)
                try:
                    async with asyncio.timeout(self._connect_timeout + self._subscribe_timeout):
                        await self._reconnect()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._log.debug("%s reconnect failed: %s", self._backend, exc)
                    await self._disconnect()
                    continue
                connected_at = loop.time()
                self._healthy = True
                safe_add(RECONNECTS, 1)
                self._log.info("%s pub/sub reconnected; %s", self._backend, self._resubscribed())
                await self._listeners.notify()
            try:
                await self._read_connected()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Any failure, even an unexpected one, is handled as a lost connection: a dead
                # reader would silently stop all live delivery of this process.
                self._log.warning(
                    "%s pub/sub connection lost (%s: %s)", self._backend, type(exc).__name__, exc
                )
                self._healthy = False
                self._waiters.release_all()
                await self._disconnect()
                if loop.time() - connected_at >= self._max_backoff:
                    delay = self._min_backoff  # a long-lived connection: start over quickly

    async def _read_pinging(
        self, pubsub: PubSub, handle: Callable[[dict[str, Any]], None], unanswered: str
    ) -> None:
        """Dispatch `pubsub`'s messages to `handle` until the connection fails; a PING probes a
        connection silent for `ping_interval`, and one unanswered for `ping_interval` more
        raises `unanswered`.

        The reads block with no deadline of their own: a deadline per read (redis-py's
        `asyncio.timeout` around each `get_message`) cost about a seventh of a gateway's time
        per delivered chunk (docs/benchmarks.md, ninth pass). The probe is a watchdog task
        beside them, woken every half interval; when the PING goes unanswered (or cannot be
        sent) it cancels this reader, which raises `unanswered` instead of the cancellation."""
        loop = asyncio.get_running_loop()
        reader = asyncio.current_task()
        assert reader is not None
        probe = _Probe(loop.time())
        watchdog = asyncio.create_task(
            self._watch(pubsub, probe, reader), name=f"{self.name}-ping-watchdog"
        )
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                probe.seen = loop.time()
                if message is not None:
                    handle(message)
        except asyncio.CancelledError:
            # Only the watchdog's own cancellation becomes the failure; any other (the bus
            # closing) stays a cancellation.
            if probe.failure is not None and reader.cancelling() == 1:
                reader.uncancel()
                raise TimeoutError(unanswered) from probe.failure
            raise
        finally:
            await cancel_and_wait(watchdog)

    async def _watch(self, pubsub: PubSub, probe: _Probe, reader: asyncio.Task[Any]) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ping_interval
        ping_sent: float | None = None
        while True:
            await asyncio.sleep(interval / 2)
            now = loop.time()
            if ping_sent is not None and probe.seen >= ping_sent:
                ping_sent = None  # answered (or anything else arrived since)
            if ping_sent is not None:
                if now - ping_sent >= interval:
                    probe.failure = TimeoutError(f"no answer to PING in {interval:g} s")
                    reader.cancel()
                    return
            elif now - probe.seen >= interval:
                ping_sent = loop.time()
                try:
                    await pubsub.ping()
                except Exception as exc:  # a dead connection: the reader fails now
                    probe.failure = exc
                    reader.cancel()
                    return
