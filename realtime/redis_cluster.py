"""Redis Cluster bus: sharded pub/sub (SSUBSCRIBE/SPUBLISH), one pub/sub connection per master."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Unpack, cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError

from realtime.bus_errors import BusClosedError, BusUnavailableError
from realtime.bus_support import (
    BusState,
    cancel_and_wait,
    check_message,
    check_replay_bounds,
)
from realtime.publish_options import PublishOptions, Replay, publish_batch, publish_stepwise
from realtime.redis import APPEND_REPLAY, SPUBLISH_REPLAYED
from realtime.redis_common import RedisBusCommon, RedisBusOptions
from realtime.redis_urls import cluster_client, describe, parse_cluster_url

log = logging.getLogger(__name__)

Node = tuple[str, int]
SLOTS = 16384


class TopologyChanged(RedisError):
    """A shard dropped one of our channels unasked: its slot moved (resharding, failover)."""


class _Shard:
    """The pub/sub connection to one master and the channels SSUBSCRIBEd on it."""

    def __init__(self, node: Node, client: Redis) -> None:
        self.node = node
        self.client = client
        self.pubsub: PubSub = client.pubsub()
        self.remote: set[bytes] = set()  # SSUBSCRIBE sent
        self.confirmed: set[bytes] = set()  # ... and confirmed by the shard
        self.leaving: Counter[bytes] = Counter()  # SUNSUBSCRIBE sent, reply pending

    async def close(self) -> None:
        with suppress(Exception):
            await self.pubsub.aclose()
        with suppress(Exception):
            await self.client.aclose()


class RedisClusterBus(RedisBusCommon[RedisCluster]):
    """Implements `realtime.bus.Bus` on a Redis Cluster with sharded pub/sub (Redis 7).

    A channel lives on the shard owning its hash slot (`channels` puts a thread's hash tag in
    its channel, replay and presence names, so all of a thread sits on one shard), and a
    message only travels within that shard. Each process keeps one pub/sub connection per
    master, SSUBSCRIBEs a channel once however many local subscriptions it has, and reads all
    of them. Any failure of any of those connections, or a shard dropping a channel because
    its slot moved, is handled as one lost connection, exactly like `RedisBus`: unhealthy,
    reload the slot map, reconnect every master, resubscribe, wait for confirmations,
    healthy, run the reconnect listeners (gateways tell clients to resync). Channels without
    a hash tag (the control and revocation channels) are sharded channels too, on the fixed
    slot their name hashes to.
    """

    _log = log
    _backend = "Redis Cluster"
    _subscribe_command = "SSUBSCRIBE"

    def __init__(
        self, url: str, prefix: str = "threadline:", **options: Unpack[RedisBusOptions]
    ) -> None:
        self._address = parse_cluster_url(url)
        super().__init__(url, prefix, **options)
        self._slots: list[Node] = []
        self._shards: dict[Node, _Shard] | None = None
        self._append: Any = None
        self._publish_replayed: Any = None

    def shard_of(self, channel: str) -> Node:
        """The master whose pub/sub carries `channel` (per the last slot map loaded)."""
        return self._slots[key_slot((self.prefix + channel).encode())]

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._state is not BusState.NEW:
            raise BusClosedError(f"RedisClusterBus is {self._state.value}; it can be opened once")
        self._client = cluster_client(
            self._address,
            client_name=self.command_client_name,
            socket_connect_timeout=self._connect_timeout,
            socket_timeout=None,  # deadlines are ours (see RedisBus)
            retry=Retry(NoBackoff(), 1),
        )
        # Both scripts touch one slot: the replay list, its byte total and (for the publish)
        # the thread channel share the thread's hash tag.
        self._append = self._client.register_script(APPEND_REPLAY)
        self._publish_replayed = self._client.register_script(SPUBLISH_REPLAYED)
        try:
            async with asyncio.timeout(self._connect_timeout + self._command_timeout):
                await self._client.initialize()
                await self._connect()
                await self._await_confirmations()
        except (RedisError, OSError) as exc:
            await self._disconnect()
            await self._close_clients()
            raise BusUnavailableError(
                f"cannot reach the Redis Cluster at {describe(self._url)}: {exc}"
            ) from exc
        self._opened()

    async def _close_clients(self) -> None:
        if self._client is not None:
            with suppress(RedisError, OSError):
                await self._client.aclose()
            self._client = None

    # -- publishing and replay -------------------------------------------------------------

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        """One sharded publish (with its append, in one script) per message, in order, then
        `publish_all`: the `then` channels may live on other shards than the replay's."""
        if options is None and isinstance(data, bytes):  # one plain message: the common case
            await self.publish_entry(channel, data, None)
            return
        batch = publish_batch(channel, data, options)
        if batch is not None:
            await publish_stepwise(self, batch)

    async def publish_entry(self, channel: str, data: bytes, replay: Replay | None) -> None:
        if replay is None:
            async with self._command("publish to %r", channel) as client:
                await client.spublish(self.prefix + channel, data)
            return
        args = [*self._append_args(data, replay.limit, replay.max_bytes), self.prefix + channel]
        async with self._command("publish to %r with replay %r", channel, replay.key):
            await self._publish_replayed(keys=self._replay_keys(replay.key), args=args)

    async def append_replay(
        self, key: str, data: bytes, limit: int, max_bytes: int | None = None
    ) -> None:
        check_replay_bounds(limit, max_bytes)
        async with self._command("append to replay %r", key):
            await self._append(
                keys=self._replay_keys(key), args=self._append_args(data, limit, max_bytes)
            )

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        """In order, one sharded publish each (their channels may live on different shards),
        then the replay cleared."""
        for _, data in messages:
            check_message(data)
        for channel, data in messages:
            await self.publish_entry(channel, data, None)
        if clear_key is not None:
            await self.clear_replay(clear_key)

    # -- subscriptions (`subscribe` itself: RedisBusCommon) ---------------------------------

    async def _sync_channels(self) -> None:
        """Make each shard's channels match the local subscriptions."""
        broken: _Shard | None = None
        async with self._lock:
            if self._shards is None:
                return  # the reconnect subscribes everything
            wanted = self._by_shard(self._subscriptions.keys())
            for node, shard in self._shards.items():
                channels = wanted.pop(node, set())
                try:
                    await self._change(shard, channels - shard.remote, shard.remote - channels)
                except (RedisError, OSError) as exc:
                    log.warning("sharded pub/sub command failed, forcing a reconnect: %s", exc)
                    broken = shard
                    break
            if broken is None and wanted:
                # The slot map names a master we have no connection to: it changed.
                broken = next(iter(self._shards.values()))
        if broken is not None:
            # Closing makes its reader fail: the usual reconnect path resubscribes everything.
            await broken.close()

    async def _change(self, shard: _Shard, added: set[bytes], removed: set[bytes]) -> None:
        for channels in _by_slot(added):
            shard.remote |= channels
            await shard.pubsub.ssubscribe(*channels)
        for channels in _by_slot(removed):
            shard.remote -= channels
            shard.confirmed -= channels
            shard.leaving.update(channels)
            await shard.pubsub.sunsubscribe(*channels)

    def _by_shard(self, channels: set[bytes]) -> dict[Node, set[bytes]]:
        grouped: dict[Node, set[bytes]] = {}
        for channel in channels:
            grouped.setdefault(self._slots[key_slot(channel)], set()).add(channel)
        return grouped

    def _is_confirmed(self, key: bytes) -> bool:
        shards = self._shards
        return shards is not None and any(key in shard.confirmed for shard in shards.values())

    # -- the pub/sub connections -----------------------------------------------------------

    async def _load_slots(self) -> None:
        """The slot map, from whichever node answers first (they agree once a failover ends)."""
        assert self._client is not None
        ranges = await self._client.execute_command("CLUSTER SLOTS")
        slots: list[Node | None] = [None] * SLOTS
        for (start, end), owners in cast(dict[tuple[int, int], dict[str, Any]], ranges).items():
            host, port = owners["primary"][:2]
            node = (host.decode() if isinstance(host, bytes) else str(host), int(port))
            slots[int(start) : int(end) + 1] = [node] * (int(end) - int(start) + 1)
        if any(node is None for node in slots):
            raise RedisError("the cluster does not cover every slot (a failover in progress?)")
        self._slots = cast(list[Node], slots)

    async def _connect(self) -> None:
        """Reload the slot map, connect to every master, SSUBSCRIBE every local channel."""
        await self._load_slots()
        async with self._lock:
            shards: dict[Node, _Shard] = {}
            try:
                for node in sorted(set(self._slots)):
                    client = Redis(
                        host=node[0],
                        port=node[1],
                        username=self._address.username,
                        password=self._address.password,
                        ssl=self._address.tls,
                        client_name=self.pubsub_client_name,
                        socket_connect_timeout=self._connect_timeout,
                        socket_timeout=None,
                        socket_keepalive=True,
                        retry=Retry(NoBackoff(), 0, supported_errors=()),
                    )
                    shard = shards[node] = _Shard(node, client)
                    await shard.pubsub.connect()
                for node, channels in self._by_shard(self._subscriptions.keys()).items():
                    await self._change(shards[node], channels, set())
            except BaseException:
                for shard in shards.values():
                    await shard.close()
                raise
            self._shards = shards

    def _connected(self) -> bool:
        return self._shards is not None

    async def _reconnect(self) -> None:
        await self._connect()
        await self._await_confirmations()

    def _resubscribed(self) -> str:
        return f"{len(self._shards or {})} masters"

    async def _disconnect(self) -> None:
        async with self._lock:
            shards, self._shards = self._shards, None
        for shard in (shards or {}).values():
            await shard.close()

    async def _await_confirmations(self) -> None:
        for shard in list((self._shards or {}).values()):
            while not shard.remote <= shard.confirmed:
                message = await shard.pubsub.get_message(timeout=self._subscribe_timeout)
                if message is not None:
                    self._handle(shard, message)

    async def _read_connected(self) -> None:
        await self._read_all(list((self._shards or {}).values()))

    async def _read_all(self, shards: list[_Shard]) -> None:
        """Read every shard until one fails; that failure is raised."""
        tasks = [asyncio.create_task(self._read(shard)) for shard in shards]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the shard's failure
            raise RedisError("a shard reader stopped")
        finally:
            for task in tasks:
                await cancel_and_wait(task)

    async def _read(self, shard: _Shard) -> None:
        handle = functools.partial(self._handle, shard)
        await self._read_pinging(shard.pubsub, handle, f"shard {shard.node} did not answer PING")

    def _handle(self, shard: _Shard, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if kind == "smessage":
            self._subscriptions.push(channel, message["data"])
        elif kind == "ssubscribe":
            shard.confirmed.add(channel)
            self._waiters.confirm(channel)
        elif kind == "sunsubscribe":
            shard.confirmed.discard(channel)
            if shard.leaving[channel] > 0:
                shard.leaving[channel] -= 1
                if not shard.leaving[channel]:
                    del shard.leaving[channel]
            elif channel in shard.remote:
                raise TopologyChanged(f"shard {shard.node} dropped {channel!r}: its slot moved")


def _by_slot(channels: set[bytes]) -> list[set[bytes]]:
    """SSUBSCRIBE takes channels of one slot per call."""
    grouped: dict[int, set[bytes]] = {}
    for channel in channels:
        grouped.setdefault(key_slot(channel), set()).add(channel)
    return list(grouped.values())
