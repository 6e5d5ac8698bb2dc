"""Many-threads benchmark: N threads x K watchers, runs arriving at a steady rate, on a single
Redis and on a 3-master Redis Cluster side by side.

    python bench/many_threads.py [--threads 1000] [--watchers 3] [--rate 20] [--seconds 15]
                                 [--quick] [--only redis|redis-cluster]

For each bus (a throwaway redis-server, then a throwaway Redis Cluster of 3 masters + 3
replicas, both on loopback) it starts a database of its own on a throwaway PostgreSQL, two
`--role gateway` and two `--role worker` processes (demo agent at 0 ms), creates N threads, and
opens K websockets per thread, each subscribed to its thread, spread over both gateways. Then
messages are sent over HTTP (alternating gateways) at `--rate` per second for `--seconds`, each
to the next thread in turn, so runs arrive steadily across many threads rather than on one busy
thread. Nothing is asserted; the figures are printed.

- first chunk / completed: send -> a watcher's receipt of the run's chunk seq 0 / of its
  step-finish chunk, per (run, watcher), p50 and p99 in ms (the send time travels in the
  message text and comes back in the echoed chunks, as in bench/fanout.py);
- runs/s: runs whose step-finish every watcher received, over the wall time from the first send
  to the last receipt (the offered rate, unless the deployment falls behind);
- worker CPU ms/run: CPU of both workers during the phase divided by the runs;
- gateway CPU us/delivery: CPU of both gateways divided by the frames all watchers received
  (it includes the HTTP sends that start the runs); "... minus idle upkeep" first subtracts
  what the gateways spent per second just holding the connections, measured for `--idle`
  seconds before the arrivals (also printed per connection: gateway idle us/s/conn);
- Redis CPU ms/run: CPU of the redis-server process(es) (all six nodes for the cluster);
- Postgres CPU ms/run: CPU of the postmaster and its backends, per run;
- Postgres xacts/run: transactions of the run's database (all processes, incl. the client's
  HTTP sends and the workers' polls) during the phase, per run: database round trips, roughly;
- missing: (run, watcher) pairs that never saw the run finish within the deadline.

The client holding every websocket is one Python process on the same machine: on a small host
it competes with the servers for CPU, so compare the two columns with each other rather than
reading them as absolute capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import psutil
from websockets.asyncio.client import ClientConnection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py, next to this script
import fanout  # bench/fanout.py: opening and closing many websockets

from tests.e2e import harness
from tests.servers import RedisClusterServer, own_postgres_server, own_redis_server

TIMEOUT = 60.0
DRAIN = 30.0  # seconds to wait for the last runs to reach every watcher


@contextlib.contextmanager
def deployment(database_url: str, redis_url: str) -> Iterator[list[harness.ServerHandle]]:
    """Two gateways then two workers; all stopped on the way out."""
    with common.deployment(
        database_url,
        redis_url,
        ("gateway", "gateway", "worker", "worker"),
        {
            # One token drives the whole load: this measures the bus, not the quotas.
            "THREADLINE_TOKEN_RATE": "100000",
            "THREADLINE_TOKEN_BURST": "100000",
            "THREADLINE_SCOPE_RATE": "100000",
            "THREADLINE_SCOPE_BURST": "100000",
            "THREADLINE_SCOPE_MAX_ACTIVE_RUNS": "100000",
            "THREADLINE_MAX_CONCURRENT_RUNS": "32",
            # One client process holds every websocket; on a busy machine its loop can stall
            # past the default 20 s pong deadline while thousands of connections open.
            "THREADLINE_WS_PING_INTERVAL": "60",
            "THREADLINE_WS_PING_TIMEOUT": "120",
        },
    ) as started:
        yield started


@dataclass
class Watcher:
    """One websocket watching one thread; records receipt times of chunk seq 0 and the end."""

    ws: ClientConnection
    frames: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    first: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                now = time.monotonic_ns()
                self.frames += 1
                frame = orjson.loads(message)
                self.kinds[str(frame.get("type"))] += 1
                if frame.get("type") != "chunk":
                    continue
                run_id = frame["run_id"]
                if frame["seq"] == 0:
                    self.first.setdefault(run_id, now)
                if frame["chunk"]["type"] == "step-finish":
                    self.done.setdefault(run_id, now)


async def settle(watchers: list[tuple[str, Watcher]], quiet: float = 1.0) -> None:
    """Until no frame arrived for `quiet` seconds (at most 60 s): the presence updates of
    thousands of joins must not be counted as deliveries of the runs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    seen, since = -1, loop.time()
    while loop.time() < deadline:
        frames = sum(w.frames for _, w in watchers)
        if frames != seen:
            seen, since = frames, loop.time()
        elif loop.time() - since >= quiet:
            return
        await asyncio.sleep(0.1)


async def transactions(database_url: str) -> int:
    """Transactions committed or rolled back in the database so far (every process's)."""
    import asyncpg

    connection = await asyncpg.connect(database_url)
    try:
        value = await connection.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
    finally:
        await connection.close()
    return int(value)


POSTGRES_PORT: list[int] = []  # the throwaway cluster's port, set by main()


def postgres_pids() -> list[int]:
    """The postmaster and its backends (pooled connections live through the whole phase)."""
    for process in psutil.process_iter():
        if _listens(process, POSTGRES_PORT[0], "postgres"):
            return [process.pid, *(c.pid for c in process.children(recursive=True))]
    return []


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def pct(values: list[float], q: float) -> float:
    return common.pct(values, q) if values else float("nan")


async def create_threads(http: httpx.AsyncClient, count: int) -> list[str]:
    gate = asyncio.Semaphore(20)

    async def one(i: int) -> str:
        async with gate:
            reply = await http.post("/v1/threads", json={"title": f"many {i}"})
            return str(reply.json()["thread"]["id"])

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def open_watchers(
    gateways: list[harness.ServerHandle], token: str, threads: list[str], per_thread: int
) -> list[tuple[str, Watcher]]:
    gate = asyncio.Semaphore(fanout.OPEN_CONCURRENCY)

    async def one(index: int, thread_id: str) -> tuple[str, Watcher]:
        gateway = gateways[index % len(gateways)]
        async with gate:
            ws = await fanout.open_subscribed(f"{gateway.ws_url}?token={token}", thread_id)
        return thread_id, Watcher(ws)

    pairs = [(i + k, t) for i, t in enumerate(threads) for k in range(per_thread)]
    return list(await asyncio.gather(*(one(index, t) for index, t in pairs)))


async def measure(
    args: argparse.Namespace, admin_dsn: str, redis_url: str, redis_pids: list[int]
) -> dict[str, float]:
    async with common.own_database(admin_dsn) as database_url:
        with deployment(database_url, redis_url) as handles:
            gateways, workers = handles[:2], handles[2:]
            token = harness.create_token(gateways[0].env, "bench", "user", "bench")
            clients = [
                httpx.AsyncClient(
                    base_url=g.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT
                )
                for g in gateways
            ]
            try:
                threads = await create_threads(clients[0], args.threads)
                watchers = await open_watchers(gateways, token, threads, args.watchers)
                for _, watcher in watchers:
                    watcher.task = asyncio.create_task(watcher.read())
                try:
                    return await load(
                        args,
                        clients,
                        threads,
                        watchers,
                        gateways,
                        workers,
                        redis_pids,
                        database_url,
                    )
                finally:
                    await fanout.close_all([w.ws for _, w in watchers])
                    for _, watcher in watchers:
                        if watcher.task is not None:
                            watcher.task.cancel()
                    await asyncio.gather(
                        *(w.task for _, w in watchers if w.task), return_exceptions=True
                    )
            finally:
                for client in clients:
                    await client.aclose()


async def load(
    args: argparse.Namespace,
    clients: list[httpx.AsyncClient],
    threads: list[str],
    watchers: list[tuple[str, Watcher]],
    gateways: list[harness.ServerHandle],
    workers: list[harness.ServerHandle],
    redis_pids: list[int],
    database_url: str,
) -> dict[str, float]:
    gateway_pids = [g.process.pid for g in gateways]
    worker_pids = [w.process.pid for w in workers]
    by_thread: dict[str, list[Watcher]] = {}
    for thread_id, watcher in watchers:
        by_thread.setdefault(thread_id, []).append(watcher)
    total = int(args.rate * args.seconds)
    sent: dict[str, tuple[int, str]] = {}  # run id -> (send ns, thread id)
    failures = 0

    async def send(index: int) -> None:
        nonlocal failures
        thread_id = threads[index % len(threads)]
        at = time.monotonic_ns()
        reply = await clients[index % 2].post(
            f"/v1/threads/{thread_id}/messages", json={"text": f"t={at}"}
        )
        if reply.status_code >= 300:
            failures += 1
            return
        sent[reply.json()["run_id"]] = (at, thread_id)

    await settle(watchers)
    # The gateways' cost of merely holding the connections (pings, presence refreshes).
    idle_start, idle_cpu = time.monotonic(), cpu(gateway_pids)
    await asyncio.sleep(args.idle)
    idle_rate = (cpu(gateway_pids) - idle_cpu) / (time.monotonic() - idle_start)
    frames_before = sum(w.frames for _, w in watchers)
    kinds_before = sum((w.kinds for _, w in watchers), Counter[str]())
    xacts_before = await transactions(database_url)
    before = [cpu(gateway_pids), cpu(worker_pids), cpu(redis_pids), cpu(postgres_pids())]
    loop = asyncio.get_running_loop()
    start = loop.time()
    senders = []
    for index in range(total):
        await asyncio.sleep(max(0.0, start + index / args.rate - loop.time()))
        senders.append(asyncio.create_task(send(index)))
    await asyncio.gather(*senders)

    def finished() -> bool:
        return all(run in w.done for run, (_, t) in sent.items() for w in by_thread[t])

    deadline = loop.time() + DRAIN
    while not finished() and loop.time() < deadline:  # noqa: ASYNC110 (no event to wait on)
        await asyncio.sleep(0.05)
    elapsed = loop.time() - start
    after = [cpu(gateway_pids), cpu(worker_pids), cpu(redis_pids), cpu(postgres_pids())]
    await asyncio.sleep(1.0)  # Postgres publishes its statistics within about a second
    xacts = await transactions(database_url) - xacts_before
    frames = sum(w.frames for _, w in watchers) - frames_before
    kinds = sum((w.kinds for _, w in watchers), Counter[str]()) - kinds_before
    first: list[float] = []
    done: list[float] = []
    missing = 0
    complete_runs = 0
    last_receipt = 0
    for run_id, (at, thread_id) in sent.items():
        complete = True
        for watcher in by_thread[thread_id]:
            if run_id in watcher.first:
                first.append((watcher.first[run_id] - at) / 1e6)
            if run_id in watcher.done:
                done.append((watcher.done[run_id] - at) / 1e6)
                last_receipt = max(last_receipt, watcher.done[run_id])
            else:
                missing += 1
                complete = False
        complete_runs += complete
    runs = max(1, len(sent))
    wall = (last_receipt / 1e9 - start) if last_receipt else elapsed
    per_watcher_run = max(1, len(sent) * len(watchers) // len(by_thread))
    return {
        "runs sent": float(len(sent)),
        "refused sends": float(failures),
        "first chunk p50 ms": statistics.median(first) if first else float("nan"),
        "first chunk p99 ms": pct(first, 0.99),
        "completed p50 ms": statistics.median(done) if done else float("nan"),
        "completed p99 ms": pct(done, 0.99),
        "runs/s completed": complete_runs / wall if wall > 0 else float("nan"),
        "worker CPU ms/run": (after[1] - before[1]) * 1000 / runs,
        "gateway CPU us/delivery": (after[0] - before[0]) * 1e6 / max(1, frames),
        "... minus idle upkeep": (after[0] - before[0] - idle_rate * elapsed)
        * 1e6
        / max(1, frames),
        "gateway idle us/s/conn": idle_rate * 1e6 / len(watchers),
        "deliveries (frames)": float(frames),
        **{
            f"{kind} frames/run/watcher": kinds[kind] / per_watcher_run
            for kind in ("chunk", "invalidate", "presence", "resync")
        },
        **{
            f"{kind} frames (total)": float(count)
            for kind, count in sorted(kinds.items())
            if kind not in ("chunk", "invalidate", "presence", "resync")
        },
        "Redis CPU ms/run": (after[2] - before[2]) * 1000 / runs,
        "Postgres xacts/run": xacts / runs,
        "Postgres CPU ms/run": (after[3] - before[3]) * 1000 / runs,
        "missing (run, watcher)": float(missing),
    }


@contextlib.contextmanager
def single_redis() -> Iterator[tuple[str, list[int]]]:
    with own_redis_server() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        pids = [c.pid for c in psutil.process_iter() if _listens(c, port)]
        yield url, pids


def _listens(process: psutil.Process, port: int, name: str = "redis-server") -> bool:
    with contextlib.suppress(psutil.Error):
        return process.name().startswith(name) and any(
            c.laddr and c.laddr.port == port for c in process.net_connections("tcp")
        )
    return False


@contextlib.contextmanager
def redis_cluster() -> Iterator[tuple[str, list[int]]]:
    cluster = RedisClusterServer().start()
    try:
        pids = [c.pid for c in psutil.process_iter() if any(_listens(c, p) for p in cluster.ports)]
        yield cluster.address, pids
    finally:
        cluster.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--watchers", type=int, default=3, help="websockets per thread")
    parser.add_argument("--rate", type=float, default=20.0, help="runs started per second")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the arrivals")
    parser.add_argument("--only", choices=["redis", "redis-cluster"])
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle measurement")
    parser.add_argument("--quick", action="store_true", help="100 threads, 10 runs/s for 5 s")
    args = parser.parse_args()
    if args.quick:
        args.threads, args.rate, args.seconds = 100, 10.0, 5.0
    fanout.raise_fd_limit(args.threads * args.watchers * 2 + 1024)
    buses = {"redis": single_redis, "redis-cluster": redis_cluster}
    if args.only:
        buses = {args.only: buses[args.only]}
    columns: dict[str, dict[str, float]] = {}
    with own_postgres_server() as admin_dsn:
        POSTGRES_PORT.append(int(admin_dsn.rsplit(":", 1)[1].split("/")[0]))
        for name, start in buses.items():
            print(f"measuring on {name} ...", file=sys.stderr, flush=True)
            with start() as (url, pids):
                columns[name] = await measure(args, admin_dsn, url, pids)
    print(
        f"Threadline many threads: {args.threads} threads x {args.watchers} watchers, "
        f"{args.rate:g} runs/s for {args.seconds:g} s; 2 gateways + 2 workers, Postgres, "
        f"demo agent at 0 ms, loopback, {os.cpu_count()} CPUs"
    )
    names = list(columns)
    print(f"{'':>26}" + "".join(f"{n:>16}" for n in names))
    for row in next(iter(columns.values())):
        print(f"{row:>26}" + "".join(f"{columns[n][row]:>16.2f}" for n in names), flush=True)


if __name__ == "__main__":
    common.run(main())
