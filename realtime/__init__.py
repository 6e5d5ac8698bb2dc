"""Live delivery: the bus and its backends, channel names, envelopes, fan-out and outboxes."""

from __future__ import annotations

from urllib.parse import urlsplit

from realtime.bus import Bus, Subscription
from realtime.errors import BusClosedError, BusError, BusUnavailableError
from realtime.hub import Hub
from realtime.memory import MemoryBus
from realtime.outbox import CLOSE_SLOW_CONSUMER, Outbox, SlowConsumerError
from realtime.publisher import Publisher

__all__ = [
    "CLOSE_SLOW_CONSUMER",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusUnavailableError",
    "Hub",
    "MemoryBus",
    "Outbox",
    "Publisher",
    "SlowConsumerError",
    "Subscription",
    "open_bus",
]

_REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})


def open_bus(redis_url: str | None, *, prefix: str = "threadline:") -> Bus:
    """The configured bus, not yet opened (`await bus.open()` or `async with bus`).

    None (THREADLINE_REDIS_URL unset) gives the in-process `MemoryBus`.
    """
    if not redis_url:
        return MemoryBus()
    scheme = urlsplit(redis_url).scheme
    if scheme not in _REDIS_SCHEMES:
        raise ValueError(f"unsupported bus URL scheme {scheme!r}; expected redis:// or rediss://")
    # Imported here so the embedded default never loads redis-py.
    from realtime.redis import RedisBus

    return RedisBus(redis_url, prefix=prefix)
