"""Chunk publishing from many live runs in one process: coalesced (`CommandPipe`, as served)
against one round trip per chunk (the same pipe taking one command per batch: the reference),
in the same run. Prints CPU µs per chunk of this process and of redis-server, writes per chunk,
publish latency; asserts nothing.

    python bench/publish_pipe.py [--runs 500,2000] [--tokens 40] [--interval-ms 50] [--redis URL]

Each run publishes its chunks through `Publisher.chunks` (what `ChunkSink` does), one every
`interval` ms, each after the previous one was accepted (a run's order), on one `RedisBus`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import psutil
import redis.asyncio as redis_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py, next to this script

from realtime.redis import RedisBus
from realtime.redis_pipe import CommandPipe
from runtime.engine.publisher import Publisher


async def one_pass(
    url: str, runs: int, tokens: int, interval: float, coalesce: bool
) -> tuple[str, float]:
    bus = RedisBus(url, prefix=f"bench-{time.monotonic_ns()}:")
    await bus.open()
    if not coalesce:  # the reference: every command its own write and round trip
        bus._pipe = CommandPipe(bus._client, timeout=5.0, senders=64, max_batch=1)  # type: ignore[arg-type]
    assert bus._pipe is not None
    pipe = bus._pipe
    publisher = Publisher(bus)
    info = redis_asyncio.Redis.from_url(url)
    server = psutil.Process(int((await info.info("server"))["process_id"]))
    me = psutil.Process()
    latencies: list[float] = []
    failures = 0

    async def run(n: int) -> None:
        nonlocal failures
        thread = f"t{n}"
        await asyncio.sleep(interval * n / runs)  # spread the starts over one interval
        for seq in range(tokens):
            data = publisher.chunk_data(thread, f"r{n}", seq, {"type": "text-delta", "delta": "x"})
            began = time.perf_counter()
            if not await publisher.chunks(thread, [data]):
                failures += 1
            latencies.append(time.perf_counter() - began)
            await asyncio.sleep(interval)

    await publisher.chunks("warm", [b"x"])  # the script loaded, the connections made
    cpu = sum(me.cpu_times()[:2]), sum(server.cpu_times()[:2])
    batches, commands = pipe.batches, pipe.commands
    started = time.perf_counter()
    async with asyncio.timeout(60 + tokens * interval * 4):  # bounded
        await asyncio.gather(*(run(n) for n in range(runs)))
    wall = time.perf_counter() - started
    mine = sum(me.cpu_times()[:2]) - cpu[0]
    theirs = sum(server.cpu_times()[:2]) - cpu[1]
    chunks = runs * tokens
    writes = pipe.batches - batches
    assert pipe.commands - commands == chunks
    await info.aclose()
    await bus.close()
    latencies.sort()
    return (
        f"{runs:5d} {'coalesced' if coalesce else 'reference':>10} {chunks / wall:9.0f}"
        f" {mine / chunks * 1e6:9.1f} {theirs / chunks * 1e6:10.1f} {writes / chunks:8.3f}"
        f" {common.pct(latencies, 0.5) * 1e3:7.2f} {common.pct(latencies, 0.99) * 1e3:7.2f}"
        f" {failures:5d}"
    ), mine / chunks * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="500,2000")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--redis")
    args = parser.parse_args()
    interval = args.interval_ms / 1e3
    print(
        f"{'runs':>5} {'publishing':>10} {'chunks/s':>9} {'µs/chunk':>9} {'redis µs':>10}"
        f" {'writes':>8} {'p50 ms':>7} {'p99 ms':>7} {'lost':>5}"
    )
    with common.servers("", args.redis) as (_, url):
        for runs in (int(n) for n in args.runs.split(",") if n):
            figures: dict[bool, list[float]] = {}
            for coalesce in (False, True, False, True):  # interleaved, twice
                line, mine = await one_pass(url, runs, args.tokens, interval, coalesce)
                print(line, flush=True)
                figures.setdefault(coalesce, []).append(mine)
            ratio = min(figures[True]) / min(figures[False])
            print(f"{runs:5d} coalesced / reference, this process's CPU per chunk: {ratio:.2f}")
    print(
        f"({args.tokens} chunks per run, {args.interval_ms:g} ms apart; writes: socket writes"
        " per chunk; latency: one `Publisher.chunks` call)"
    )


if __name__ == "__main__":
    common.run(main())
