"""How each idle gateway's periodic task grows with connections, threads and gateways: counted.

    python bench/idle_counts.py [--connections 1000] [--threads 100] [--window 20]
                                [--only redis,redis-cluster]

The companion of bench/idle.py, which times one gateway: here nothing is timed. On Redis (and
a Redis Cluster), `--role gateway` processes on one Postgres database get idle subscribed
connections (as in bench/idle.py: presence on, one token per person, round robin over the
gateways), and over the window the work of each periodic task is counted, for four shapes:
N connections on T threads and one gateway; 2N on T (connections doubled); N on T/10 (threads
cut tenfold); N on T over two gateways. Per task (keepalive pings the clients answered, Redis
commands by the client that sent them, Postgres transactions, the gateways' event-loop wake-ups)
it prints the count per second
in each shape, so a task that grows with connections doubles in the second column, one that
grows with threads drops in the third, and one per gateway doubles in the fourth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py
import fanout  # bench/fanout.py: the descriptor limit
import fanout_compare as compare
import idle  # bench/idle.py: servers, tokens, connections, MONITOR
import wsclient


@contextlib.asynccontextmanager
async def gateways(
    bus: idle.Bus, count: int, connections: int
) -> AsyncIterator[list[compare.Peer]]:
    """`count` gateways on `bus`."""
    log_dir = Path(tempfile.mkdtemp(prefix="threadline-idle-"))
    async with contextlib.AsyncExitStack() as stack:
        peers = [
            await stack.enter_async_context(idle.threadline(bus, log_dir, connections))
            for _ in range(count)
        ]
        yield peers


async def shape(
    bus: idle.Bus, connections: int, threads: int, gateway_count: int, args: argparse.Namespace
) -> dict[str, float]:
    """Per second over the window: "task" -> count."""
    async with gateways(bus, gateway_count, connections) as servers:
        ports = [server.port for server in servers]
        tokens = await idle.mint(bus.database_url, min(args.people, connections))
        thread_ids = await idle.create_threads(ports[0], tokens[0], threads)
        tally = wsclient.Tally()
        clients: list[wsclient.Client] = []
        try:
            for index, port in enumerate(ports):
                peer = compare.Peer("gateway", 0, port, "", b"", "")
                share = connections // gateway_count
                # Each gateway gets its share of the people and of the threads' watchers.
                clients += await idle.open_connections(
                    peer, tally, share, thread_ids, tokens[index::gateway_count]
                )
            await asyncio.sleep(args.settle)
            async with idle.Monitor(bus.redis_nodes) as monitor:
                xacts = await idle.flushed_transactions(bus.database_url)
                pings, started = tally.pings, time.monotonic()
                woken = sum(idle.wakeups(server.pid) for server in servers)
                monitor.reset()
                await asyncio.sleep(args.window)
                elapsed = time.monotonic() - started
                woken = sum(idle.wakeups(server.pid) for server in servers) - woken
                counted = {k: v / elapsed for k, v in monitor.counts.items()}
            xacts = await idle.flushed_transactions(bus.database_url) - xacts
            counted["keepalive pings answered"] = float(tally.pings - pings) / elapsed
            counted["Postgres transactions"] = float(xacts) / elapsed
            # Loop wake-ups of all the gateways (keepalive ticks, polls, reads): not per connection.
            counted["gateway wake-ups (voluntary context switches)"] = woken / elapsed
            return counted
        finally:
            wsclient.close_all(clients)


def label(task: str) -> str:
    """A task's name without the per-process part of a bus client's name."""
    name, _, verb = task.partition(": ")
    if name.startswith("threadline-") and name.endswith(("-pubsub", "-cmd")):
        name = "threadline bus " + name.rsplit("-", 1)[1]
    return f"{name}: {verb}" if verb else name


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--people", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=20.0, help="one ping interval")
    parser.add_argument("--only", default="redis,redis-cluster")
    args = parser.parse_args()
    n, t = args.connections, args.threads
    shapes = [(n, t, 1), (2 * n, t, 1), (n, max(1, t // 10), 1), (n, t, 2)]
    fanout.raise_fd_limit(4 * n + 1024)
    names = [name for name in args.only.split(",") if name]
    with common.servers(None, None) as (admin_dsn, redis_url):
        async with idle.buses(names, admin_dsn, redis_url) as made:
            for bus in made:
                columns = []
                for connections, threads, count in shapes:
                    print(
                        f"{bus.name}: {connections} connections, {threads} threads, "
                        f"{count} gateway(s) ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    columns.append(await shape(bus, connections, threads, count, args))
                merged: list[dict[str, float]] = [{} for _ in columns]
                for column, counted in zip(merged, columns, strict=True):
                    for task, rate in counted.items():
                        column[label(task)] = column.get(label(task), 0.0) + rate
                heads = [f"{c}c/{th}t/{g}gw" for c, th, g in shapes]
                print(
                    f"\n{bus.name}: periodic work per second while idle ({args.window:g} s window"
                    f" after {args.settle:g} s; c connections, t threads, gw gateways)"
                )
                print(f"{'task':<44}" + "".join(f"{h:>16}" for h in heads))
                tasks = sorted({k for c in merged for k in c}, key=lambda k: -merged[0].get(k, 0))
                for task in tasks:
                    print(f"{task:<44}" + "".join(f"{c.get(task, 0):>16.2f}" for c in merged))


if __name__ == "__main__":
    common.run(main())
