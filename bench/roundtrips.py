"""Round trips per demo run on Postgres + Redis: sequential one-step demo runs on a thread of
200 messages (like bench/runtime_bench.py's sequential runs), counting what this process writes to
each server's socket (one write per request: a round trip) and naming the statements and
commands sent. Prints its counts; asserts nothing.

    python bench/roundtrips.py --postgres ADMIN_DSN --redis URL [--runs 20] [--length 200]
                               [--detail]

The counts include the driving client's own requests (its read of the run when an
invalidation says it may have ended; its subscription), as bench/runtime_bench.py's CPU does.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import sys
from asyncio import selector_events
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["THREADLINE_DEMO_DELAY_MS"] = "0"

import asyncpg
import common  # bench/common.py, next to this script
import runtime_bench as bench  # bench/runtime_bench.py, next to this script
from redis.asyncio.connection import AbstractConnection

from realtime import open_bus
from runtime.demo import demo_agent
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.service.thread_service import ThreadService
from runtime.storage import open_store


class Counter:
    """Socket writes per server port, and what was sent (while `on`)."""

    def __init__(self, ports: dict[int, str]) -> None:
        self.ports = ports
        self.on = False
        self.width = 110  # characters of a statement to show
        self.writes: collections.Counter[str] = collections.Counter()
        self.sent: collections.Counter[str] = collections.Counter()

    def install(self) -> None:
        counter = self
        # The private transport class behind every asyncio socket (typeshed leaves it out).
        transport_class: Any = selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
        write = transport_class.write

        def counting_write(transport: Any, data: Any) -> None:
            if counter.on:
                peer = transport.get_extra_info("peername")
                name = counter.ports.get(peer[1] if peer else -1)
                if name is not None:
                    counter.writes[name] += 1
            write(transport, data)

        transport_class.write = counting_write

        for method in ("execute", "fetch", "fetchrow", "fetchval"):
            original = getattr(asyncpg.Connection, method)

            def wrap(original: Any = original) -> Any:
                async def counted(self: Any, query: str, *args: Any, **kw: Any) -> Any:
                    if counter.on:
                        counter.sent["pg: " + " ".join(query.split())[: counter.width]] += 1
                    return await original(self, query, *args, **kw)

                return counted

            setattr(asyncpg.Connection, method, wrap())

        packed = AbstractConnection.send_packed_command

        async def sending(self: Any, command: Any, check_health: bool = True) -> None:
            if counter.on:
                parts = command if isinstance(command, list) else [command]
                text = b"".join(bytes(p) for p in parts)[:200]
                words = [w for w in text.split(b"\r\n") if w and w[:1] not in b"*$"]
                counter.sent[
                    "redis: " + " ".join(w.decode(errors="replace") for w in words[:2])
                ] += 1
            await packed(self, command, check_health)

        AbstractConnection.send_packed_command = sending  # type: ignore[method-assign]


async def measure(dsn: str, redis_url: str, runs: int, length: int, counter: Counter) -> int:
    agent = demo_agent()
    async with open_store(dsn) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        thread = await service.create_thread(bench.PRINCIPAL, title="roundtrips")
        thread_id = thread.thread.id
        await bench.prefill(store, thread_id, length)
        async with Worker(store, bus, agent):
            await bench.drive(service, bus, store, thread_id, 2)  # warm-up
            await asyncio.sleep(0.2)
            counter.on = True
            await bench.drive(service, bus, store, thread_id, runs)
            await asyncio.sleep(0.05)  # the last run's release and wakeup
            counter.on = False
    return runs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", required=True, help="admin DSN (a database is made)")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--detail", action="store_true", help="list statements and commands")
    parser.add_argument("--width", type=int, default=110, help="characters of a statement")
    args = parser.parse_args()
    pg_port = urlsplit(args.postgres).port or 5432
    redis_port = urlsplit(args.redis).port or 6379
    counter = Counter({pg_port: "postgres", redis_port: "redis"})
    counter.width = args.width
    counter.install()
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(common.own_database(args.postgres))
        runs = await measure(dsn, args.redis, args.runs, args.length, counter)
    for name in ("postgres", "redis"):
        print(f"{name:9} {counter.writes[name] / runs:6.2f} socket writes per run")
    if args.detail:
        for text, count in sorted(counter.sent.items()):
            print(f"{count / runs:6.2f}  {text}")


if __name__ == "__main__":
    common.run(main())
