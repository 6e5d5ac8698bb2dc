"""Runtime benchmark: added latency per chunk (model delta -> published canonical chunk) and runs
per second with the demo model at zero delay. Prints its figures; asserts nothing.

    python bench/runtime.py [--chunks 400] [--runs 200] [--threads 8] [--postgres ADMIN_DSN]
                            [--redis URL] [--scale-out]

With --postgres the benchmark creates a database of its own through ADMIN_DSN and drops it after.
--scale-out adds the Postgres + Redis column on a throwaway cluster and redis-server of the
run's own (for whichever of --postgres / --redis is not given).

Both figures are measured side by side in one run for the embedded default (SQLite + in-process
bus) and, when given, for Postgres + Redis, so ratios are comparable on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["THREADLINE_DEMO_DELAY_MS"] = "0"

import common  # bench/common.py, next to this script

from realtime import open_bus
from realtime.channels import thread_channel
from runtime.agent import Agent
from runtime.demo import demo_agent
from runtime.domain import Principal, Role
from runtime.providers.base import FinishDelta, ModelDelta, ModelRequest, TextDelta
from runtime.providers.scripted import FunctionModel
from runtime.publisher import Publisher
from runtime.service import ThreadService
from runtime.storage import open_store
from runtime.worker import Worker

PRINCIPAL = Principal(subject="bench", role=Role.USER, scopes=frozenset({"bench"}))


async def chunk_latency(store_url: str, redis_url: str | None, chunks: int) -> list[float]:
    """Seconds from a model delta being yielded to its chunk arriving at a bus subscriber."""
    yielded: list[float] = []

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        for i in range(chunks):
            yielded.append(time.perf_counter())
            yield TextDelta(text=f"w{i} ")
            await asyncio.sleep(0.0005)  # a model streams; back-to-back deltas would queue
        yield FinishDelta(reason="stop")

    received: list[float] = []
    agent = Agent(model=FunctionModel(model))
    async with open_store(store_url) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        async with Worker(store, bus, agent, poll_interval=0.05):
            thread = await service.create_thread(PRINCIPAL, title="latency")
            thread_id = thread.thread.id
            done = asyncio.Event()

            async def listen() -> None:
                async with bus.subscribe(thread_channel(thread_id)) as subscription:
                    ready.set()
                    async for data in subscription:
                        frame = orjson.loads(data)
                        if frame["type"] == "chunk" and frame["chunk"]["type"] == "text-delta":
                            received.append(time.perf_counter())
                            if len(received) == chunks:
                                done.set()

            ready = asyncio.Event()
            listener = asyncio.create_task(listen())
            await ready.wait()
            await service.send_message(PRINCIPAL, thread_id, "go")
            await asyncio.wait_for(done.wait(), 120)
            listener.cancel()
    return [r - y for y, r in zip(yielded, received, strict=False)]


async def runs_per_second(
    store_url: str, redis_url: str | None, runs: int, threads: int
) -> tuple[float, int]:
    agent = demo_agent()
    async with open_store(store_url) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        async with Worker(store, bus, agent, poll_interval=0.02, max_concurrent_runs=threads):
            ids = [
                (await service.create_thread(PRINCIPAL, title=f"t{i}")).thread.id
                for i in range(threads)
            ]
            per_thread = max(1, runs // threads)

            async def drive(thread_id: str) -> int:
                # Like a client: react to invalidations instead of polling storage.
                completed = 0
                async with bus.subscribe(thread_channel(thread_id)) as subscription:
                    frames = aiter(subscription)
                    for n in range(per_thread):
                        await service.send_message(PRINCIPAL, thread_id, f"hello number {n}")
                        while True:
                            frame = orjson.loads(await asyncio.wait_for(anext(frames), 30))
                            if frame["type"] != "invalidate":
                                continue
                            snap = await store.snapshot(thread_id, PRINCIPAL.scopes)
                            if snap.run is not None and snap.run.status.is_terminal:
                                break
                        completed += 1
                return completed

            started = time.perf_counter()
            total = sum(await asyncio.gather(*(drive(t) for t in ids)))
            elapsed = time.perf_counter() - started
    return total / elapsed, total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=400)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--postgres", help="DSN of a database to use for the scale-out column")
    parser.add_argument("--redis", help="Redis URL for the scale-out column")
    parser.add_argument(
        "--scale-out", action="store_true", help="own Postgres/Redis for the scale-out column"
    )
    args = parser.parse_args()
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if args.scale_out:
            args.postgres, args.redis = stack.enter_context(
                common.servers(args.postgres, args.redis)
            )
        setups: list[tuple[str, str, str | None]] = [
            ("sqlite+memory", f"sqlite:///{tmp}/bench.db", None)
        ]
        if args.postgres:
            dsn = await stack.enter_async_context(common.own_database(args.postgres))
            setups.append(("postgres+redis", dsn, args.redis))
        print(f"{'setup':16} {'chunk p50 µs':>13} {'chunk p99 µs':>13} {'runs/s':>9}")
        for name, store_url, redis_url in setups:
            latencies = await chunk_latency(store_url, redis_url, args.chunks)
            rate, total = await runs_per_second(store_url, redis_url, args.runs, args.threads)
            row: dict[str, Any] = {
                "p50": statistics.median(latencies) * 1e6,
                "p99": common.pct(latencies, 0.99) * 1e6,
            }
            print(f"{name:16} {row['p50']:13.0f} {row['p99']:13.0f} {rate:9.1f}  ({total} runs)")


if __name__ == "__main__":
    asyncio.run(main())
