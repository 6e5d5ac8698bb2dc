"""The quota limiter under a burst: N concurrent calls of two gateways' counters on one Redis.

    python bench/limiter_burst.py [--calls 3000] [--rounds 3] [--redis URL]

Two `RedisCounters` (two gateways) on one Redis (a throwaway redis-server unless `--redis` is
given; keys under a prefix of this run's own, deleted after). Each round runs three bursts of
`--calls` concurrent calls (asyncio.gather), half on each gateway:

- connect: `join` of one connection set per call, all under one subject's set with a cap of
  exactly `--calls`; then one more join must be refused.
- command: `take` of one token from one bucket with a burst of `--calls` and no refill to speak
  of; then one more take must be refused.
- close: `leave` of every connection.

Per burst it prints the wall time, calls/s, the p50/p99/max latency of one call, how many calls
the shared Redis counters saw (a call that fell back to this process's counters is missing
there), the fallbacks, and the Redis connections the limiter's client holds afterwards (CLIENT
LIST, by client name). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import pct
from redis.asyncio import Redis

from realtime.counters import RedisCounters
from tests.servers import own_redis_server


class Fallbacks(logging.Handler):
    """Counts the limiter's fallback warnings (once per outage) beside its own counter."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def fallbacks(counters: RedisCounters) -> int:  # not counted before the batcher
    return int(getattr(counters, "fallbacks", 0))


async def timed(call: Callable[[], Awaitable[Any]], latencies: list[float]) -> Any:
    start = time.perf_counter()
    result = await call()
    latencies.append(time.perf_counter() - start)
    return result


async def burst(
    name: str, calls: list[Callable[[], Awaitable[Any]]], shared: Callable[[], Awaitable[int]]
) -> list[Any]:
    latencies: list[float] = []
    start = time.perf_counter()
    results = await asyncio.gather(*(timed(call, latencies) for call in calls))
    wall = time.perf_counter() - start
    seen = await shared()
    print(
        f"  {name:8} {wall * 1000:7.1f} ms {len(calls) / wall:9.0f} calls/s"
        f"  p50 {pct(latencies, 0.5) * 1000:6.1f} ms  p99 {pct(latencies, 0.99) * 1000:6.1f} ms"
        f"  max {max(latencies) * 1000:6.1f} ms  in Redis {seen}/{len(calls)}"
    )
    return results


async def one_round(
    gateways: list[RedisCounters], admin: Redis, prefix: str, number: int, calls: int
) -> None:
    print(f"round {number}: {calls} concurrent calls on 2 gateways")
    subject, bucket = f"ws:subject:{{s{number}}}", f"rate:token:t{number}"
    slots = [
        ((f"ws:token:{{s{number}}}:{i}", subject), uuid.uuid4().hex, gateways[i % 2])
        for i in range(calls)
    ]

    async def in_set() -> int:
        return int(await admin.zcard(prefix + subject))

    async def taken() -> int:
        tokens = await admin.hget(prefix + bucket, "tokens")
        return calls - round(float(tokens or calls))

    async def left() -> int:
        return calls - await in_set()

    joins = await burst(
        "connect", [partial(g.join, keys, (1, calls), m, 60.0) for keys, m, g in slots], in_set
    )
    extra = await gateways[0].join((subject,), (calls,), "one-more", 60.0)
    print(f"           joins admitted {joins.count(-1)}, one more admitted: {extra < 0}")
    await gateways[0].leave((subject,), "one-more")
    waits = await burst(
        "command", [partial(g.take, bucket, 1e-6, calls) for _, _, g in slots], taken
    )
    extra_wait = await gateways[0].take(bucket, 1e-6, calls)
    print(f"           takes allowed {waits.count(0.0)}, one more allowed: {extra_wait == 0.0}")
    await burst("close", [partial(g.leave, keys, m) for keys, m, g in slots], left)


async def run(url: str, calls: int, rounds: int) -> None:
    prefix = f"bench-limits-{uuid.uuid4().hex[:8]}:"
    gateways = [RedisCounters(url, prefix), RedisCounters(url, prefix)]
    admin = Redis.from_url(url)
    warnings = Fallbacks()
    logger = logging.getLogger("realtime.counters")
    logger.setLevel(logging.WARNING)
    logger.addHandler(warnings)
    try:
        for number in range(1, rounds + 1):
            await one_round(gateways, admin, prefix, number, calls)
            clients = await admin.client_list()
            held = sum(1 for c in clients if c.get("name") == "threadline-limits")
            print(
                f"           fallbacks {sum(fallbacks(g) for g in gateways)}"
                f" (warnings logged {warnings.count}),"
                f" limiter connections held by both gateways: {held}"
            )
    finally:
        for gateway in gateways:
            await gateway.close()
        async for key in admin.scan_iter(match=prefix + "*"):
            await admin.delete(key)
        await admin.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis", help="a Redis URL (default: a throwaway redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with ExitStack() as stack:
        url = args.redis or stack.enter_context(own_redis_server())
        asyncio.run(run(url, args.calls, args.rounds))


if __name__ == "__main__":
    main()
