"""Fan-out benchmark: subscribers on two gateway processes over Redis; latency, rate, idle RSS.

One thread watched by N websocket subscribers split across two `--role gateway` processes, a
`--role worker` process, Postgres and Redis. Prints latency, delivered frames/s and the gateway's
RSS per idle connection.

    python bench/fanout.py [--subscribers 1,100,1000] [--messages 20] [--idle 1000,5000]
                           [--compare-subscribers 1000] [--compare-idle 1000,5000]
                           [--rates 10,20,40,80,120,160] [--step-seconds 3]
                           [--postgres ADMIN_DSN] [--redis URL] [--quick]
                           [--loop uvloop|asyncio]

Two parts. First, Threadline beside a raw `websockets` + Redis reference measured in the same
run (bench/fanout_compare.py: server CPU per delivery, p50/p99/p99.9, deliveries/s kept up, RSS
per idle subscribed connection, with and without permessage-deflate offered and accepted).
Second, the end-to-end fan-out below. Both servers of the comparison run on --loop (uvloop by
default, what `threadline serve` takes when it is installed).

Everything runs on loopback: a database of its own (created through ADMIN_DSN, dropped after;
without --postgres or --redis, a throwaway cluster or redis-server of the run's own),
`threadline serve --role gateway` twice and `--role worker` once (demo agent, no delay), and this
client process holding every websocket. Nothing is asserted; the figures are printed.

Method. Messages are sent one at a time over HTTP to gateway 1; each carries its send time,
`t=<time.monotonic_ns()>`, and the demo agent echoes it ("You said: t=…") in 5-character
text-delta chunks. Every subscriber timestamps each chunk frame on receipt and parses the send
time back out of the echoed text, so latencies are measured against a timestamp that travelled
through the server (CLOCK_MONOTONIC is system-wide, and everything here shares one clock):

- first chunk: send -> receipt of the run's chunk seq 0, per subscriber and message. It includes
  the HTTP command, queue admission (a commit), the wakeup, lease and episode start, and the
  Redis hop: end-to-end, not the bus alone;
- last chunk: send -> receipt of the step-finish chunk;
- spread: receipt of a chunk minus its earliest receipt among all subscribers, i.e. how much
  later than the first subscriber the others got the same chunk (fan-out cost, incl. this
  client's own event loop, which reads every subscriber);
- frames/s: chunk and invalidate frames received by all subscribers together, divided by the
  wall time of the sending phase (sequential messages: a latency-bound rate, not a maximum);
- CPU s: CPU time this client, each gateway and the worker used during that phase. With one
  client process reading every subscriber, the client saturates first at high counts: compare
  its column with the gateways' before reading the latencies as the server's.

Idle connections: RSS of gateway 1 (psutil) before and after opening N connections that each
subscribe to one quiet thread, divided by N (measured cumulatively: 1k, then up to 5k, on the
fresh gateway before the fan-out phases, whose freed memory would otherwise be reused).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py, next to this script
import fanout_compare as compare

from tests.e2e import harness

TIMEOUT = 60.0
OPEN_CONCURRENCY = 100
STAMP = re.compile(r"t=(\d+)")
HEADER = (
    f"{'subscribers':>11} {'messages':>8} {'first p50':>10} {'first p99':>10} "
    f"{'last p50':>9} {'last p99':>9} {'spread p50':>10} {'spread p99':>10} {'frames/s':>10}"
    f"  CPU s client/gw1/gw2/worker"
)


def pct(values: list[float], q: float) -> float:
    return common.pct(values, q) if values else float("nan")


def raise_fd_limit(need: int) -> int:
    """Raise the soft RLIMIT_NOFILE (children inherit it); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@contextlib.contextmanager
def processes(
    database_url: str, redis_url: str, extra: dict[str, str] | None = None
) -> Iterator[list[harness.ServerHandle]]:
    """Gateway 1, gateway 2, worker (`extra`: more environment); all stopped on the way out,
    whatever happened."""
    roles = ("gateway", "gateway", "worker")
    with common.deployment(database_url, redis_url, roles, extra) as started:
        for handle in started:  # this process may be pinned off a core: they are not
            compare.pin(handle.process.pid, compare.cores())
        yield started


# --- subscribers ----------------------------------------------------------------------


@dataclass
class Tracker:
    """Counts step-finish receipts per run so the sender knows when every subscriber has it."""

    finished: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def finish(self, run_id: str) -> None:
        self.finished[run_id] = self.finished.get(run_id, 0) + 1
        self.changed.set()

    async def wait(self, run_id: str, count: int) -> None:
        async with asyncio.timeout(TIMEOUT):
            while self.finished.get(run_id, 0) < count:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Subscriber:
    ws: ClientConnection
    tracker: Tracker
    frames: int = 0
    # run_id -> [(seq, receipt ns)], and the run's text so far
    chunks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                now = time.monotonic_ns()
                frame = orjson.loads(message)
                self.frames += 1
                if frame.get("type") != "chunk":
                    continue
                run_id, chunk = frame["run_id"], frame["chunk"]
                self.chunks.setdefault(run_id, []).append((frame["seq"], now))
                if chunk["type"] == "text-delta":
                    self.texts.setdefault(run_id, []).append(chunk["delta"])
                elif chunk["type"] == "step-finish":
                    self.tracker.finish(run_id)


async def open_subscribed(url: str, thread_id: str, timeout: float = TIMEOUT) -> ClientConnection:
    ws = await connect(
        url,
        open_timeout=timeout,
        close_timeout=2,
        ping_interval=None,
        max_size=2**22,
        compression=None,
    )
    await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1}).decode())
    async with asyncio.timeout(timeout):
        while orjson.loads(await ws.recv()).get("type") != "subscribed":
            pass
    return ws


async def open_many(urls: list[str], thread_id: str) -> list[ClientConnection]:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(url: str) -> ClientConnection:
        async with gate:
            return await open_subscribed(url, thread_id)

    return list(await asyncio.gather(*(one(url) for url in urls)))


async def close_all(connections: list[ClientConnection]) -> None:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY * 5)

    async def one(ws: ClientConnection) -> None:
        async with gate:
            with contextlib.suppress(Exception):
                await ws.close()

    await asyncio.gather(*(one(ws) for ws in connections))


# --- phases ---------------------------------------------------------------------------


async def wait_idle(http: httpx.AsyncClient, thread_id: str) -> None:
    """Until the thread's latest run has ended (so the next message starts a run at once)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            snapshot = (await http.get(f"/v1/threads/{thread_id}")).json()
            run = snapshot["run"]
            if run is None or run["status"] in ("completed", "failed", "cancelled"):
                return
            await asyncio.sleep(0.005)


def cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU time of each process so far (this one first)."""
    times = []
    for pid in [os.getpid(), *pids]:
        cpu = psutil.Process(pid).cpu_times()
        times.append(cpu.user + cpu.system)
    return times


async def fan_out(
    gateways: list[harness.ServerHandle],
    server_pids: list[int],
    token: str,
    count: int,
    messages: int,
) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=gateways[0].url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT
    ) as http:
        thread_id = (await http.post("/v1/threads", json={"title": f"fan-out {count}"})).json()[
            "thread"
        ]["id"]
        urls = [f"{gateways[i % len(gateways)].ws_url}?token={token}" for i in range(count)]
        tracker = Tracker()
        subscribers = [Subscriber(ws, tracker) for ws in await open_many(urls, thread_id)]
        for subscriber in subscribers:
            subscriber.task = asyncio.create_task(subscriber.read())
        try:
            run_ids: list[str] = []
            started = time.monotonic()
            frames_before = sum(s.frames for s in subscribers)
            cpu_before = cpu_seconds(server_pids)
            for _ in range(messages):
                sent = await http.post(
                    f"/v1/threads/{thread_id}/messages", json={"text": f"t={time.monotonic_ns()}"}
                )
                run_id = sent.json()["run_id"]
                run_ids.append(run_id)
                await tracker.wait(run_id, count)
                await wait_idle(http, thread_id)
            elapsed = time.monotonic() - started
            frames = sum(s.frames for s in subscribers) - frames_before
            cpu = [b - a for a, b in zip(cpu_before, cpu_seconds(server_pids), strict=True)]
        finally:
            await close_all([s.ws for s in subscribers])
            for subscriber in subscribers:
                if subscriber.task is not None:
                    subscriber.task.cancel()
            await asyncio.gather(*(s.task for s in subscribers if s.task), return_exceptions=True)
    return {**summarise(subscribers, run_ids, frames / elapsed), "cpu": cpu}


def summarise(subscribers: list[Subscriber], run_ids: list[str], rate: float) -> dict[str, Any]:
    first: list[float] = []
    last: list[float] = []
    spread: list[float] = []
    earliest: dict[tuple[str, int], int] = {}
    for subscriber in subscribers:
        for run_id in run_ids:
            for seq, at in subscriber.chunks.get(run_id, []):
                key = (run_id, seq)
                earliest[key] = min(earliest.get(key, at), at)
    for subscriber in subscribers:
        for run_id in run_ids:
            received = subscriber.chunks.get(run_id, [])
            stamp = STAMP.search("".join(subscriber.texts.get(run_id, [])))
            if not received or stamp is None:
                continue  # cannot happen unless frames were lost; counted as missing below
            sent_ns = int(stamp.group(1))
            first.append((min(at for seq, at in received if seq == 0) - sent_ns) / 1e6)
            last.append((received[-1][1] - sent_ns) / 1e6)
            spread += [(at - earliest[(run_id, seq)]) / 1e6 for seq, at in received]
    expected = len(subscribers) * len(run_ids)
    if len(first) != expected:
        print(
            f"  warning: {expected - len(first)} of {expected} (subscriber, message) pairs "
            "were incomplete",
            file=sys.stderr,
        )
    return {
        "first_p50": statistics.median(first) if first else float("nan"),
        "first_p99": pct(first, 0.99),
        "last_p50": statistics.median(last) if last else float("nan"),
        "last_p99": pct(last, 0.99),
        "spread_p50": statistics.median(spread) if spread else float("nan"),
        "spread_p99": pct(spread, 0.99),
        "rate": rate,
    }


async def idle_rss(
    gateway: harness.ServerHandle, token: str, steps: list[int]
) -> list[tuple[int, float, float, float]]:
    """(connections, RSS before MiB, RSS after MiB, KiB per connection), cumulatively."""
    process = psutil.Process(gateway.process.pid)
    async with httpx.AsyncClient(
        base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT
    ) as http:
        thread_id = (await http.post("/v1/threads", json={"title": "idle"})).json()["thread"]["id"]
    url = f"{gateway.ws_url}?token={token}"
    opened: list[ClientConnection] = []
    rows = []
    await asyncio.sleep(1.0)
    before = process.memory_info().rss
    try:
        for target in sorted(steps):
            opened += await open_many([url] * (target - len(opened)), thread_id)
            await asyncio.sleep(1.0)  # let the server finish what the handshakes started
            after = process.memory_info().rss
            rows.append((target, before / 2**20, after / 2**20, (after - before) / target / 1024))
    finally:
        await close_all(opened)
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", default="1,100,1000", help="comma-separated counts")
    parser.add_argument("--messages", type=int, default=20, help="messages per subscriber count")
    parser.add_argument("--idle", default="1000,5000", help="idle connection counts (cumulative)")
    parser.add_argument("--postgres", help="admin DSN to create a database (default: own server)")
    parser.add_argument("--redis", help="Redis URL (default: a redis-server of its own)")
    parser.add_argument(
        "--compare-subscribers",
        type=int,
        default=1000,
        help="subscribers of the side-by-side comparison",
    )
    parser.add_argument(
        "--compare-idle",
        default="1000,5000",
        help="idle connection counts of the comparison (cumulative)",
    )
    parser.add_argument(
        "--rates", default="10,20,40,80,120,160", help="messages/s steps of the comparison"
    )
    parser.add_argument("--step-seconds", type=float, default=3.0, help="length of a rate step")
    parser.add_argument("--compare-only", action="store_true", help="skip the end-to-end part")
    parser.add_argument("--quick", action="store_true", help="a few seconds of each part")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="event loop of both servers compared (the gateway's default: uvloop when installed)",
    )
    args = parser.parse_args()
    if args.quick:
        args.subscribers, args.messages, args.idle = "1,20", 5, "200"
        args.compare_subscribers, args.compare_idle = 50, "50"
        args.rates, args.step_seconds = "10,40", 1.0
    counts = [int(n) for n in args.subscribers.split(",") if n]
    idle = [int(n) for n in args.idle.split(",") if n]
    compare_idle = [int(n) for n in args.compare_idle.split(",") if n]
    limit = raise_fd_limit(max([*idle, *counts, *compare_idle, 0]) + 1024)
    if idle and max(idle) + 512 > limit:
        print(f"warning: RLIMIT_NOFILE is {limit}; idle counts capped", file=sys.stderr)
        idle = [n for n in idle if n + 512 <= limit]
        compare_idle = [n for n in compare_idle if n + 512 <= limit]
    args.compare_idle = compare_idle
    # Redis, Postgres, the clients and the publisher off the core the servers under test get.
    compare.pin_self_off_server_core()
    with common.servers(args.postgres, args.redis) as (admin_dsn, redis_url):
        await measure(args, admin_dsn, redis_url, counts, idle)


async def measure(
    args: argparse.Namespace, admin_dsn: str, redis_url: str, counts: list[int], idle: list[int]
) -> None:
    async with common.own_database(admin_dsn) as database_url:
        await compare.run(args, database_url, redis_url)
        if args.compare_only:
            return
        with processes(database_url, redis_url) as (gateway_1, gateway_2, worker):
            pids = [p.process.pid for p in (gateway_1, gateway_2, worker)]
            token = harness.create_token(gateway_1.env, "bench", "user", "bench")
            print(
                "Threadline fan-out: 2 gateways + 1 worker, Postgres + Redis, demo agent at 0 ms,"
                f" loopback, {os.cpu_count()} CPUs; times in ms (see the module docstring)"
            )
            # Idle connections first, on a fresh gateway: memory the fan-out phases freed would
            # otherwise be reused and hide part of the cost.
            idle_rows = await idle_rss(gateway_1, token, idle)
            print(HEADER)
            for count in counts:
                row = await fan_out([gateway_1, gateway_2], pids, token, count, args.messages)
                print(
                    f"{count:>11} {args.messages:>8} {row['first_p50']:>10.2f} "
                    f"{row['first_p99']:>10.2f} {row['last_p50']:>9.2f} {row['last_p99']:>9.2f} "
                    f"{row['spread_p50']:>10.2f} {row['spread_p99']:>10.2f} {row['rate']:>10.0f}"
                    f"  {'/'.join(f'{c:.1f}' for c in row['cpu'])}",
                    flush=True,
                )
            print()
            print(
                f"{'idle connections':>16} {'RSS before MiB':>14} {'RSS after MiB':>13} "
                f"{'per connection KiB':>18}"
            )
            for connections, rss_before, rss_after, per in idle_rows:
                print(
                    f"{connections:>16} {rss_before:>14.1f} {rss_after:>13.1f} {per:>18.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    common.run(main())
