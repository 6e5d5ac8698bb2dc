"""Live delivery: the bus and its backends, channel names, envelopes, fan-out and outboxes."""

from __future__ import annotations

import logging

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from realtime.bus import Bus, Subscription
from realtime.bus_errors import BusClosedError, BusError, BusUnavailableError
from realtime.hub import Hub
from realtime.memory import MemoryBus
from realtime.outbox import CLOSE_SLOW_CONSUMER, Outbox, SlowConsumerError
from realtime.publish_options import PublishOptions, Replay
from realtime.redis_urls import check_redis_url, is_cluster_url

__all__ = [
    "CLOSE_SLOW_CONSUMER",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusUnavailableError",
    "Hub",
    "MemoryBus",
    "Outbox",
    "PublishOptions",
    "Replay",
    "SlowConsumerError",
    "Subscription",
    "connect_bus",
    "open_bus",
]

log = logging.getLogger(__name__)


async def connect_bus(bus: Bus, *, timeout: float) -> None:
    """Open `bus`, retrying with backoff while it is unreachable for up to `timeout` seconds.

    A process started while Redis restarts waits for it instead of exiting; once open, the bus
    itself rides out outages. Raises BusUnavailableError when the deadline passes.
    """

    def attempt_failed(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning("bus unreachable (attempt %d), retrying: %s", state.attempt_number, error)

    async for attempt in AsyncRetrying(
        stop=stop_after_delay(timeout),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        retry=retry_if_exception_type(BusUnavailableError),
        before_sleep=attempt_failed,
        reraise=True,
    ):
        with attempt:
            await bus.open()


def open_bus(redis_url: str | None, *, prefix: str = "threadline:") -> Bus:
    """The configured bus, not yet opened (`await bus.open()` or `async with bus`).

    None (THREADLINE_REDIS_URL unset) gives the in-process `MemoryBus`; `redis://` and
    `rediss://` a `RedisBus`; `redis+cluster://host:port[,host:port...]` a `RedisClusterBus`
    (sharded pub/sub on a Redis 7 cluster).
    """
    if not redis_url:
        return MemoryBus()
    check_redis_url(redis_url)
    # Imported here so the embedded default never loads redis-py.
    if is_cluster_url(redis_url):
        from realtime.redis_cluster import RedisClusterBus

        return RedisClusterBus(redis_url, prefix=prefix)
    from realtime.redis import RedisBus

    return RedisBus(redis_url, prefix=prefix)
