"""Presence fan-out cost, side by side with plain chunk fan-out, on two gateways over Redis.

    python bench/presence.py [--connections 1000] [--typists 50] [--seconds 5] [--messages 5]
                             [--postgres ADMIN_DSN] [--redis URL] [--quick]

N websocket connections (half on each of two `--role gateway` processes, one `--role worker`,
Postgres and Redis, all on loopback; throwaway servers unless given) subscribe to one thread, so
all N are present in it. Two phases, each timed on its own:

- chunks: `--messages` messages are sent one after another; the demo agent (no delay) streams
  each reply to all N connections. Counted: chunk frames received by all connections.
- presence: `--typists` of the N connections (each its own person: one token per connection)
  toggle their typing state every 250 ms for `--seconds`; every toggle is a change all N
  connections are told about. Counted: presence frames received by all connections.

Per phase it prints frames delivered per second (all connections, and per gateway), the CPU
seconds each gateway used, and frames per gateway CPU second: what one presence frame costs next
to one chunk frame. One client process reads every connection, so at high counts it may be the
bottleneck: its CPU is printed too. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py
import fanout  # bench/fanout.py: processes, connection helpers

TIMEOUT = 120.0
JOIN_TIMEOUT = 600.0
# Slower than the server's coalescing bound (200 ms), so every toggle is a change others see.
TOGGLE_EVERY = 0.25


@dataclass
class Reader:
    ws: ClientConnection
    gateway: int
    counts: Counter[str] = field(default_factory=Counter)
    members: set[str] = field(default_factory=set)  # who this connection sees present
    want: int = 0  # `everyone` is set once this many members are seen
    everyone: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                frame = orjson.loads(message)
                kind = str(frame.get("type"))
                self.counts["presence" if kind.startswith("presence") else kind] += 1
                if kind == "presence":
                    self.members = {m["subject"] for m in frame["members"]}
                elif kind == "presence.join":
                    self.members.add(frame["member"]["subject"])
                elif kind == "presence.leave":
                    self.members.discard(frame["subject"])
                if len(self.members) >= self.want:
                    self.everyone.set()
        self.everyone.set()  # closed: it will see nobody more (counted in the summary)


async def open_readers(urls: list[str], thread_id: str) -> list[Reader]:
    """Open and subscribe every connection, each read from the moment it is subscribed (a
    connection nobody reads stops answering pings and is closed by the server)."""
    gate = asyncio.Semaphore(fanout.OPEN_CONCURRENCY)

    async def one(index: int, url: str) -> Reader:
        async with gate:
            # Generous: the one client process is slow while N^2 join frames arrive.
            ws = await fanout.open_subscribed(url, thread_id, timeout=JOIN_TIMEOUT)
        reader = Reader(ws, index % 2, want=len(urls))
        reader.task = asyncio.create_task(reader.read())
        return reader

    return list(await asyncio.gather(*(one(i, url) for i, url in enumerate(urls))))


async def all_see_everyone(readers: list[Reader], timeout: float) -> float:
    """Seconds until every connection sees all of them present."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        await asyncio.gather(*(r.everyone.wait() for r in readers))
    return time.monotonic() - started


def totals(readers: list[Reader], kind: str) -> list[int]:
    """Frames of `kind` received so far: [all, gateway 1's connections, gateway 2's]."""
    per = [sum(r.counts[kind] for r in readers if r.gateway == g) for g in (0, 1)]
    return [sum(per), *per]


async def phase(
    readers: list[Reader], kind: str, pids: list[int], work: asyncio.Future[None] | None = None
) -> tuple[list[float], list[float], float]:
    """(frames/s all+per gateway, CPU s client+per process, seconds) while `work` runs."""
    before, cpu_before, started = totals(readers, kind), fanout.cpu_seconds(pids), time.monotonic()
    assert work is not None
    await work
    await asyncio.sleep(0.5)  # let the last frames arrive
    elapsed = time.monotonic() - started
    after, cpu_after = totals(readers, kind), fanout.cpu_seconds(pids)
    rates = [(a - b) / elapsed for a, b in zip(after, before, strict=True)]
    cpu = [a - b for a, b in zip(cpu_after, cpu_before, strict=True)]
    return rates, cpu, elapsed


async def send_messages(http: httpx.AsyncClient, thread_id: str, count: int) -> None:
    for i in range(count):
        await fanout.wait_idle(http, thread_id)
        text = f"bench message {i} " + "lorem ipsum dolor sit amet " * 8
        response = await http.post(f"/v1/threads/{thread_id}/messages", json={"text": text})
        response.raise_for_status()
    await fanout.wait_idle(http, thread_id)


async def toggle(readers: list[Reader], thread_id: str, seconds: float) -> None:
    async def one(reader: Reader, offset: float) -> None:
        await asyncio.sleep(offset)
        typing = True
        deadline = time.monotonic() + seconds
        frame = {"type": "presence.update", "thread_id": thread_id, "typing": typing}
        with contextlib.suppress(ConnectionClosed):  # counted as closed in the summary
            while time.monotonic() < deadline:
                frame = {"type": "presence.update", "thread_id": thread_id, "typing": typing}
                await reader.ws.send(orjson.dumps(frame).decode())
                typing = not typing
                await asyncio.sleep(TOGGLE_EVERY)
            await reader.ws.send(orjson.dumps({**frame, "typing": False}).decode())

    step = TOGGLE_EVERY / max(1, len(readers))
    await asyncio.gather(*(one(r, i * step) for i, r in enumerate(readers)))


def row(name: str, rates: list[float], cpu: list[float], elapsed: float) -> str:
    gateway_cpu = cpu[1] + cpu[2]
    per_cpu = rates[0] * elapsed / gateway_cpu if gateway_cpu > 0 else float("nan")
    return (
        f"{name:>9} {elapsed:>6.1f} {rates[0]:>12.0f} {rates[1]:>10.0f} {rates[2]:>10.0f}"
        f" {cpu[1]:>7.2f} {cpu[2]:>7.2f} {cpu[0]:>8.2f} {per_cpu:>16.0f}"
    )


async def mint(database_url: str, count: int) -> list[str]:
    """One token per connection (subjects person-0 …), minted in this process: one
    `threadline token create` per token would take a Python start-up each."""
    from runtime.domain import Role
    from server.app import open_storage
    from server.auth import create_token

    async with contextlib.AsyncExitStack() as stack:
        store = await open_storage(database_url, stack)
        return [
            await create_token(store, subject=f"person-{i}", role=Role.USER, scopes=["bench"])
            for i in range(count)
        ]


async def measure(args: argparse.Namespace, admin_dsn: str, redis_url: str) -> None:
    async with common.own_database(admin_dsn) as database_url:
        # One client process reads every connection: while 1 000 joins fan out it can be
        # slower than the server's 20 s pong deadline, which is not what this measures.
        slow_clients = {"THREADLINE_WS_PING_INTERVAL": "60", "THREADLINE_WS_PING_TIMEOUT": "120"}
        with fanout.processes(database_url, redis_url, slow_clients) as (
            gateway_1,
            gateway_2,
            worker,
        ):
            pids = [p.process.pid for p in (gateway_1, gateway_2, worker)]
            tokens = await mint(database_url, args.connections)
            token = tokens[0]
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(
                base_url=gateway_1.url, headers=headers, timeout=TIMEOUT
            ) as http:
                created = await http.post("/v1/threads", json={"title": "presence bench"})
                thread_id = created.json()["thread"]["id"]
                urls = [
                    f"{(gateway_1, gateway_2)[i % 2].ws_url}?token={tokens[i]}"
                    for i in range(args.connections)
                ]
                cpu_before, started = fanout.cpu_seconds(pids), time.monotonic()
                readers = await open_readers(urls, thread_id)
                connections = [r.ws for r in readers]
                opened = time.monotonic() - started
                try:
                    converged = opened + await all_see_everyone(readers, JOIN_TIMEOUT)
                    cpu = [a - b for a, b in zip(fanout.cpu_seconds(pids), cpu_before, strict=True)]
                    joins = totals(readers, "presence")[0]
                    complete = sum(1 for r in readers if len(r.members) >= len(readers))
                    codes = Counter(r.ws.close_code for r in readers if r.ws.close_code)
                    print(
                        f"Threadline presence vs chunk fan-out: {args.connections} connections"
                        f" on one thread, 2 gateways + 1 worker, Postgres + Redis, loopback,"
                        f" {os.cpu_count()} CPUs"
                    )
                    print(
                        f"joins: {args.connections} connections subscribed in {opened:.1f} s,"
                        f" all see all {args.connections} present (or closed) after"
                        f" {converged:.1f} s;"
                        f" {joins} presence frames; gateway CPU {cpu[1]:.2f} + {cpu[2]:.2f} s,"
                        f" client {cpu[0]:.2f} s; {complete} saw everyone, closed by the"
                        f" server: {dict(codes) or 'none'}"
                    )
                    print(
                        f"{'phase':>9} {'secs':>6} {'frames/s all':>12} {'gw1 /s':>10}"
                        f" {'gw2 /s':>10} {'gw1 CPU':>7} {'gw2 CPU':>7} {'client':>8}"
                        f" {'frames/gw CPU s':>16}"
                    )
                    work = asyncio.ensure_future(send_messages(http, thread_id, args.messages))
                    print(row("chunks", *await phase(readers, "chunk", pids, work)), flush=True)
                    typists = readers[: args.typists]
                    work = asyncio.ensure_future(toggle(typists, thread_id, args.seconds))
                    print(
                        row("presence", *await phase(readers, "presence", pids, work)), flush=True
                    )
                    sent = len(typists) * int(args.seconds / TOGGLE_EVERY)
                    closed = sum(1 for r in readers if r.ws.close_code is not None)
                    print(
                        f"({len(typists)} typists sent about {sent} presence.update frames,"
                        f" each a change for {args.connections} connections;"
                        f" {closed} connections were closed by the server meanwhile)"
                    )
                finally:
                    for reader in readers:
                        if reader.task is not None:
                            reader.task.cancel()
                    await fanout.close_all(connections)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--typists", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--postgres", help="admin DSN to create a database (default: own server)")
    parser.add_argument("--redis", help="Redis URL (default: a redis-server of its own)")
    parser.add_argument("--quick", action="store_true", help="40 connections, 5 typists, 2 s")
    args = parser.parse_args()
    if args.quick:
        args.connections, args.typists, args.seconds, args.messages = 40, 5, 2.0, 2
    fanout.raise_fd_limit(args.connections + 1024)
    with common.servers(args.postgres, args.redis) as (admin_dsn, redis_url):
        await measure(args, admin_dsn, redis_url)


if __name__ == "__main__":
    common.run(main())
