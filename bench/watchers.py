"""Refetch-storm benchmark: one commit on a thread watched by 10 / 100 / 1 000 websocket clients
across two gateways; storage reads per commit per gateway (counted, not timed) and how long the
watchers take to converge. Prints; asserts nothing.

    python bench/watchers.py [--watchers 10,100,1000] [--commits 5] [--postgres ADMIN_DSN]
                             [--redis URL] [--no-compare] [--quick]

A deployment of two `--role gateway` processes and one `--role worker` on Postgres + Redis
(throwaway servers unless given). Half the watchers hold a websocket on each gateway and
subscribe to one thread; each does what a careful client does on an `invalidate` newer than
the snapshot it holds: `GET /v1/threads/{id}` from its own gateway with `If-None-Match` of the
snapshot it holds. A commit is a rename (`PATCH /v1/threads/{id}`) through gateway 1, one at a
time; the next starts when every watcher holds the new version.

- reads/commit: each gateway's `threadline_snapshot_reads_total{source="storage"}` (its
  /metrics) over the measured commits, divided by their number: the storage reads a commit
  costs that gateway. `cached` is the same for `source="cache"`.
- convergence: from sending the rename to a watcher holding the snapshot of its version, per
  watcher and commit; p50 and p99. All watchers live in this one client process, which also
  makes every refetch, so at 1 000 the client's own event loop is part of the figure.

Unless --no-compare, the same is measured with the snapshot cache off
(`THREADLINE_SNAPSHOT_CACHE=0`) in the same run: the reads every refetch used to cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api  # bench/api.py, next to this script
import common  # bench/common.py, next to this script

from tests.e2e import harness
from tests.e2e.prometheus_server import snapshot_reads

OPEN_CONCURRENCY = 50


async def get(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> httpx.Response:
    """A GET, tried once more if the server had closed the idle keep-alive connection."""
    try:
        return await http.get(path, headers=headers)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.get(path, headers=headers)


@dataclass
class Watcher:
    ws: ClientConnection
    http: httpx.AsyncClient
    thread_id: str
    held: int = 0
    etag: str | None = None
    converged: asyncio.Event = field(default_factory=asyncio.Event)
    target: int = 1 << 62
    at: float = 0.0

    async def follow(self) -> None:
        """Refetch on every invalidation newer than the held version (one in flight)."""
        async for data in self.ws:
            frame = orjson.loads(data)
            if frame.get("type") not in ("invalidate", "resync"):
                continue
            if frame.get("version", self.held + 1) <= self.held:
                continue
            headers = {"If-None-Match": self.etag} if self.etag else {}
            got = await get(self.http, f"/v1/threads/{self.thread_id}", headers)
            if got.status_code == 200:
                self.held = got.json()["thread"]["version"]
                self.etag = got.headers.get("etag")
            if self.held >= self.target and not self.converged.is_set():
                self.at = time.perf_counter()
                self.converged.set()


@dataclass
class Row:
    watchers: int
    cache: bool
    reads: list[float]  # storage reads per commit, per gateway
    cached: list[float]
    converge_ms: list[float]


async def open_watchers(
    gateways: list[harness.ServerHandle],
    clients: list[httpx.AsyncClient],
    token: str,
    thread_id: str,
    count: int,
) -> list[Watcher]:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(n: int) -> Watcher:
        gateway = gateways[n % len(gateways)]
        async with gate:
            ws = await connect(
                gateway.ws_url,
                subprotocols=["threadline.v1", f"bearer.{token}"],  # type: ignore[list-item]
                open_timeout=60,
                max_size=2**24,
            )
            await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id}).decode())
            while orjson.loads(await ws.recv())["type"] != "subscribed":
                pass
        watcher = Watcher(ws, clients[n % len(clients)], thread_id)
        snapshot = await get(watcher.http, f"/v1/threads/{thread_id}", {})
        watcher.held, watcher.etag = snapshot.json()["thread"]["version"], snapshot.headers["etag"]
        return watcher

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def measure(
    gateways: list[harness.ServerHandle], token: str, count: int, commits: int, cache: bool
) -> Row:
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=g.url, headers=headers, timeout=60, limits=limits)
            )
            for g in gateways
        ]
        writer = clients[0]
        created = await writer.post("/v1/threads", json={"title": f"watched by {count}"})
        thread_id = created.json()["thread"]["id"]
        watchers = await open_watchers(gateways, clients, token, thread_id, count)
        tasks = [asyncio.create_task(w.follow()) for w in watchers]
        try:
            converge: list[float] = []
            before = [snapshot_reads(g.url) for g in gateways]
            for n in range(commits):
                for watcher in watchers:
                    watcher.converged.clear()
                sent = time.perf_counter()
                renamed = await writer.patch(f"/v1/threads/{thread_id}", json={"title": f"r{n}"})
                version = renamed.json()["version"]
                for watcher in watchers:
                    watcher.target = version
                    if watcher.held >= version:
                        watcher.at = time.perf_counter()
                        watcher.converged.set()
                async with asyncio.timeout(120):
                    await asyncio.gather(*(w.converged.wait() for w in watchers))
                converge.extend((w.at - sent) * 1e3 for w in watchers)
            after = [snapshot_reads(g.url) for g in gateways]
        finally:
            for task in tasks:
                task.cancel()
            for watcher in watchers:
                await watcher.ws.close()
            await asyncio.gather(*tasks, return_exceptions=True)
    return Row(
        count,
        cache,
        [(a["storage"] - b["storage"]) / commits for a, b in zip(after, before, strict=True)],
        [(a["cache"] - b["cache"]) / commits for a, b in zip(after, before, strict=True)],
        converge,
    )


async def deployment_rows(
    postgres: str, redis: str, counts: list[int], commits: int, cache: bool
) -> list[Row]:
    extra = api.agent_env("api_agent", {"THREADLINE_SNAPSHOT_CACHE": "1024" if cache else "0"})
    async with common.own_database(postgres) as dsn:
        with common.deployment(dsn, redis, ["gateway", "gateway", "worker"], extra) as handles:
            gateways = handles[:2]
            token = gateways[0].token("bench")
            rows = []
            for count in counts:
                rows.append(await measure(gateways, token, count, commits, cache))
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", default="10,100,1000")
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--postgres", help="admin DSN (a database is made)")
    parser.add_argument("--redis")
    parser.add_argument("--no-compare", action="store_true", help="skip the cache-off runs")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 and 10, 2 commits")
    args = parser.parse_args()
    if args.quick:
        args.watchers, args.commits = "4,10", 2
    counts = [int(n) for n in args.watchers.split(",") if n]
    with common.servers(args.postgres, args.redis) as (postgres, redis):
        rows = await deployment_rows(postgres, redis, counts, args.commits, cache=True)
        if not args.no_compare:
            rows += await deployment_rows(postgres, redis, counts, args.commits, cache=False)
    print(
        f"{'watchers':>8} {'cache':>5} {'reads/commit gw1':>16} {'gw2':>6} {'cached gw1':>10}"
        f" {'gw2':>6} {'converge p50 ms':>15} {'p99 ms':>8}"
    )
    for row in rows:
        print(
            f"{row.watchers:8d} {'on' if row.cache else 'off':>5} {row.reads[0]:16.2f}"
            f" {row.reads[1]:6.2f} {row.cached[0]:10.2f} {row.cached[1]:6.2f}"
            f" {common.pct(row.converge_ms, 0.5):15.2f} {common.pct(row.converge_ms, 0.99):8.2f}"
        )
    print(f"({args.commits} commits each; watchers split evenly over the two gateways)")


if __name__ == "__main__":
    common.run(main())
