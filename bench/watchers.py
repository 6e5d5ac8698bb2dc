"""Refetch-storm benchmark: one commit on a thread watched by 10 / 100 / 1 000 websocket clients
across two gateways; storage reads per commit per gateway (counted, not timed), refetches per
commit, and how long the watchers take to converge, with snapshot deltas on and off in the
same run. Prints; asserts nothing.

    python bench/watchers.py [--watchers 10,100,1000] [--commits 5] [--postgres ADMIN_DSN]
                             [--redis URL] [--cache-off] [--quick]

A deployment of two `--role gateway` processes and one `--role worker` on Postgres + Redis
(throwaway servers unless given). Half the watchers hold a websocket on each gateway and
subscribe to one thread; each does what a careful client does on an `invalidate` newer than
the snapshot it holds: with deltas on (`"deltas": true` in its subscribe), apply the frame's
delta when it starts at the held version (threadline_wire.snapshot_delta.apply); otherwise
`GET /v1/threads/{id}` from its own gateway with `If-None-Match` of the snapshot it holds. A
commit is a rename (`PATCH /v1/threads/{id}`) through gateway 1, one at a time; the next starts
when every watcher holds the new version.

- reads/commit: each gateway's `threadline_snapshot_reads_total{source="storage"}` (its
  /metrics) over the measured commits, divided by their number: the storage reads a commit
  costs that gateway. `cached` is the same for `source="cache"`.
- refetches/commit: the watchers' `GET`s per commit (of them `304`); `deltas/commit`: deltas
  applied instead.
- convergence: from sending the rename to a watcher holding the snapshot of its version, per
  watcher and commit; p50 and p99. All watchers live in this one client process, which also
  makes every refetch and decodes every frame, so at 1 000 the client's own event loop is part
  of the figure.

Deltas off and on run on the same deployment, off then on for each count. With --cache-off,
the deltas-off rows are measured once more with the snapshot cache off
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
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from threadline_wire.snapshot_delta import DeltaMismatch, apply

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


async def patch(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    """A PATCH, tried once more if the server had closed the idle keep-alive connection (it was
    not read then: a rename is the same commit either way)."""
    try:
        return await http.patch(path, json=body)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.patch(path, json=body)


@dataclass
class Watcher:
    ws: ClientConnection
    http: httpx.AsyncClient
    thread_id: str
    deltas: bool
    held: int = 0
    etag: str | None = None
    wire: dict[str, Any] = field(default_factory=dict)
    converged: asyncio.Event = field(default_factory=asyncio.Event)
    target: int = 1 << 62
    at: float = 0.0
    refetches: int = 0
    not_modified: int = 0
    applied: int = 0

    async def follow(self) -> None:
        """On every invalidation newer than the held version: apply its delta when it starts
        at the held version, else refetch (one in flight)."""
        async for data in self.ws:
            frame = orjson.loads(data)
            if frame.get("type") not in ("invalidate", "resync"):
                continue
            if frame.get("version", self.held + 1) <= self.held:
                continue
            if not self._apply(frame):
                await self._refetch()
            if self.held >= self.target and not self.converged.is_set():
                self.at = time.perf_counter()
                self.converged.set()

    def _apply(self, frame: dict[str, Any]) -> bool:
        delta = frame.get("delta")
        if not isinstance(delta, dict) or delta.get("from") != self.held:
            return False
        try:
            self.wire = apply(self.wire, delta)
        except DeltaMismatch:
            return False
        self.held, self.etag = self.wire["thread"]["version"], delta.get("etag")
        self.applied += 1
        return True

    async def _refetch(self) -> None:
        headers = {"If-None-Match": self.etag} if self.etag else {}
        got = await get(self.http, f"/v1/threads/{self.thread_id}", headers)
        self.refetches += 1
        if got.status_code == 200:
            self.wire = got.json()
            self.held = self.wire["thread"]["version"]
            self.etag = got.headers.get("etag")
        elif got.status_code == 304:
            self.not_modified += 1


@dataclass
class Row:
    watchers: int
    cache: bool
    deltas: bool
    reads: list[float]  # storage reads per commit, per gateway
    cached: list[float]
    converge_ms: list[float]
    refetches: float  # the watchers' GETs per commit
    not_modified: float
    applied: float  # deltas applied per commit


async def open_watchers(
    gateways: list[harness.ServerHandle],
    clients: list[httpx.AsyncClient],
    token: str,
    thread_id: str,
    count: int,
    deltas: bool,
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
            subscribe = {"type": "subscribe", "thread_id": thread_id, "deltas": deltas}
            await ws.send(orjson.dumps(subscribe).decode())
            while orjson.loads(await ws.recv())["type"] != "subscribed":
                pass
        watcher = Watcher(ws, clients[n % len(clients)], thread_id, deltas)
        snapshot = await get(watcher.http, f"/v1/threads/{thread_id}", {})
        watcher.wire, watcher.etag = snapshot.json(), snapshot.headers["etag"]
        watcher.held = watcher.wire["thread"]["version"]
        return watcher

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def measure(
    gateways: list[harness.ServerHandle],
    token: str,
    count: int,
    commits: int,
    cache: bool,
    deltas: bool,
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
        watchers = await open_watchers(gateways, clients, token, thread_id, count, deltas)
        tasks = [asyncio.create_task(w.follow()) for w in watchers]
        try:
            # Let the gateways' first builds (the deltas' bases) land before measuring.
            await patch(writer, f"/v1/threads/{thread_id}", {"title": "warm"})
            await asyncio.sleep(0.5)
            converge: list[float] = []
            before = [snapshot_reads(g.url) for g in gateways]
            counted = [(w.refetches, w.not_modified, w.applied) for w in watchers]
            for n in range(commits):
                for watcher in watchers:
                    watcher.converged.clear()
                sent = time.perf_counter()
                renamed = await patch(writer, f"/v1/threads/{thread_id}", {"title": f"r{n}"})
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
            refetches, not_modified, applied = (
                sum(now - then for now, then in zip(column, start, strict=True)) / commits
                for column, start in zip(
                    zip(*[(w.refetches, w.not_modified, w.applied) for w in watchers], strict=True),
                    zip(*counted, strict=True),
                    strict=True,
                )
            )
        finally:
            for task in tasks:
                task.cancel()
            for watcher in watchers:
                await watcher.ws.close()
            await asyncio.gather(*tasks, return_exceptions=True)
    return Row(
        count,
        cache,
        deltas,
        [(a["storage"] - b["storage"]) / commits for a, b in zip(after, before, strict=True)],
        [(a["cache"] - b["cache"]) / commits for a, b in zip(after, before, strict=True)],
        converge,
        refetches,
        not_modified,
        applied,
    )


async def deployment_rows(
    postgres: str, redis: str, counts: list[int], commits: int, cache: bool, modes: list[bool]
) -> list[Row]:
    extra = api.agent_env("api_agent", {"THREADLINE_SNAPSHOT_CACHE": "1024" if cache else "0"})
    async with common.own_database(postgres) as dsn:
        with common.deployment(dsn, redis, ["gateway", "gateway", "worker"], extra) as handles:
            gateways = handles[:2]
            token = gateways[0].token("bench")
            # A throwaway round first: the deployment's first commits may race its start (a
            # resync makes every watcher refetch once more), which no measured row should pay.
            await measure(gateways, token, 2, 2, cache, True)
            rows = []
            for count in counts:
                for deltas in modes:
                    rows.append(await measure(gateways, token, count, commits, cache, deltas))
    return rows


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", default="10,100,1000")
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--postgres", help="admin DSN (a database is made)")
    parser.add_argument("--redis")
    parser.add_argument("--cache-off", action="store_true", help="add the cache-off rows")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 4 and 10, 2 commits, cache off too"
    )
    args = parser.parse_args()
    if args.quick:
        args.watchers, args.commits, args.cache_off = "4,10", 2, True
    counts = [int(n) for n in args.watchers.split(",") if n]
    with common.servers(args.postgres, args.redis) as (postgres, redis):
        rows = await deployment_rows(postgres, redis, counts, args.commits, True, [False, True])
        if args.cache_off:
            rows += await deployment_rows(postgres, redis, counts, args.commits, False, [False])
    print(
        f"{'watchers':>8} {'cache':>5} {'deltas':>6} {'reads/commit gw1':>16} {'gw2':>6}"
        f" {'cached gw1':>10} {'gw2':>6} {'refetches/commit':>16} {'(304)':>6}"
        f" {'deltas/commit':>13} {'converge p50 ms':>15} {'p99 ms':>8}"
    )
    for row in rows:
        print(
            f"{row.watchers:8d} {on_off(row.cache):>5} {on_off(row.deltas):>6} {row.reads[0]:16.2f}"
            f" {row.reads[1]:6.2f} {row.cached[0]:10.2f} {row.cached[1]:6.2f}"
            f" {row.refetches:16.1f} {row.not_modified:6.1f} {row.applied:13.1f}"
            f" {common.pct(row.converge_ms, 0.5):15.2f} {common.pct(row.converge_ms, 0.99):8.2f}"
        )
    print("deltas on / off, same deployment:")
    for count in counts:
        pair = {r.deltas: r for r in rows if r.cache and r.watchers == count}
        if len(pair) == 2:
            on, off = pair[True], pair[False]
            p50 = common.pct(on.converge_ms, 0.5) / common.pct(off.converge_ms, 0.5)
            p99 = common.pct(on.converge_ms, 0.99) / common.pct(off.converge_ms, 0.99)
            print(f"{count:8d} watchers: convergence p50 x{p50:.3f}, p99 x{p99:.3f}")
    print(
        f"({args.commits} commits each; watchers split evenly over the two gateways, all in"
        " this one client process, one token: one viewer class)"
    )


if __name__ == "__main__":
    common.run(main())
