"""Refetch-storm benchmark: one commit on a thread watched by 10 / 100 / 1 000 websocket clients
across two gateways; storage reads per commit per gateway (counted, not timed), refetches per
commit, and how long the watchers take to converge, with snapshot deltas on and off in the
same run. Prints; asserts nothing.

    python bench/watchers.py [--watchers 10,100,1000] [--commits 5] [--postgres ADMIN_DSN]
                             [--redis URL] [--processes N] [--cache-off] [--quick]

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
  watcher and commit; p50 and p99. By default all watchers live in this one client process,
  which also makes every refetch and decodes every frame, so at 1 000 the client's own event
  loop is part of the figure; `--processes N` spreads them over N processes of their own
  (bench/watcher_group.py; the times are CLOCK_MONOTONIC, one clock for the box).

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
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api  # bench/api.py, next to this script
import common  # bench/common.py, next to this script
from watcher_group import RemoteGroup, WatcherGroup, patch  # next to this script

from tests.e2e import harness
from tests.e2e.prometheus_server import snapshot_reads


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


Group = WatcherGroup | RemoteGroup


async def measure(
    gateways: list[harness.ServerHandle],
    token: str,
    count: int,
    commits: int,
    cache: bool,
    deltas: bool,
    processes: int = 0,
) -> Row:
    """One row; `processes` > 0: the watchers live in that many processes of their own, split
    evenly (0: in this one, beside the writer)."""
    headers = {"Authorization": f"Bearer {token}"}
    urls = [(g.url, g.ws_url) for g in gateways]
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(
            httpx.AsyncClient(base_url=gateways[0].url, headers=headers, timeout=60)
        )
        created = await writer.post("/v1/threads", json={"title": f"watched by {count}"})
        thread_id = created.json()["thread"]["id"]
        groups: list[Group] = []
        if processes <= 0:
            groups.append(WatcherGroup(urls, token, thread_id, count, deltas))
        else:
            for n in range(processes):
                # Watchers offset by the ones before, so each gateway still gets half.
                share = count // processes + (n < count % processes)
                offset = sum(count // processes + (m < count % processes) for m in range(n))
                config = {
                    "gateways": urls,
                    "token": token,
                    "thread_id": thread_id,
                    "count": share,
                    "deltas": deltas,
                    "offset": offset,
                }
                groups.append(RemoteGroup(config))
        for group in groups:
            await stack.enter_async_context(group)
        # Let the gateways' first builds (the deltas' bases) land before measuring.
        warm = (await patch(writer, f"/v1/threads/{thread_id}", {"title": "warm"})).json()
        counted = [(await g.target(warm["version"]))[1] for g in groups]
        before = [snapshot_reads(g.url) for g in gateways]
        converge: list[float] = []
        for n in range(commits):
            sent = time.perf_counter()
            renamed = await patch(writer, f"/v1/threads/{thread_id}", {"title": f"r{n}"})
            answers = await asyncio.gather(*(g.target(renamed.json()["version"]) for g in groups))
            converge.extend((at - sent) * 1e3 for times, _ in answers for at in times)
        after = [snapshot_reads(g.url) for g in gateways]
        refetches, not_modified, applied = (
            sum(end[k] - start[k] for (_, end), start in zip(answers, counted, strict=True))
            / commits
            for k in range(3)
        )
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
    postgres: str,
    redis: str,
    counts: list[int],
    commits: int,
    cache: bool,
    modes: list[bool],
    processes: int,
) -> list[Row]:
    extra = api.agent_env("api_agent", {"THREADLINE_SNAPSHOT_CACHE": "1024" if cache else "0"})
    async with common.own_database(postgres) as dsn:
        with common.deployment(dsn, redis, ["gateway", "gateway", "worker"], extra) as handles:
            gateways = handles[:2]
            token = gateways[0].token("bench")
            # A throwaway round first: the deployment's first commits may race its start (a
            # resync makes every watcher refetch once more), which no measured row should pay.
            await measure(gateways, token, 2, 2, cache, True, processes)
            rows = []
            for count in counts:
                for deltas in modes:
                    row = await measure(gateways, token, count, commits, cache, deltas, processes)
                    rows.append(row)
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
        "--processes", type=int, default=0, help="watcher processes (0: in this one)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 4 and 10, 2 commits, cache off too"
    )
    args = parser.parse_args()
    if args.quick:
        args.watchers, args.commits, args.cache_off = "4,10", 2, True
    counts = [int(n) for n in args.watchers.split(",") if n]
    with common.servers(args.postgres, args.redis) as (postgres, redis):
        rows = await deployment_rows(
            postgres, redis, counts, args.commits, True, [False, True], args.processes
        )
        if args.cache_off:
            rows += await deployment_rows(
                postgres, redis, counts, args.commits, False, [False], args.processes
            )
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
    where = (
        f"in {args.processes} client processes of their own"
        if args.processes > 0
        else "all in this one client process, beside the writer"
    )
    print(
        f"({args.commits} commits each; watchers split evenly over the two gateways, {where};"
        " one token: one viewer class)"
    )


if __name__ == "__main__":
    common.run(main())
