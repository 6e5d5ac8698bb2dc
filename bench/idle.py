"""Idle connections: what a quiet tab costs a gateway, beside a raw `websockets` server.

    python bench/idle.py [--connections 1000,5000,10000] [--threads 100] [--people 1000]
                         [--settle 8] [--window 20] [--only embedded,redis,redis-cluster]
                         [--server-env NAME=VALUE ...] [--variant NAME=VALUE[,...] ...]
                         [--tree LABEL=DIR ...] [--quick]

For each count N, a fresh process of each server under test, pinned to core 0 (this client,
Redis and Postgres on the other core), gets N websocket connections (bench/wsclient.py: one
asyncio Protocol each, answering pings) spread round robin over `--threads` threads, each
subscribed to its thread and, on Threadline, present in it (presence is on: one person per
token, `--people` tokens shared round robin by the connections, each expiring in an hour so
every connection carries an expiry timer). Then `--settle` seconds and until the server is quiet,
then a `--window` of nothing published. Per server and N:

- CPU ms/s of the server process over the window (the scheduler's run time of its threads,
  /proc/PID/task/*/schedstat, in ns: the 10 ms ticks of user + system time are 0.5 µs/s per
  connection at 1 000 over 20 s, a fifth of the figure); "empty": the same process
  for half a window before its first connection (its own timers and polls); per connection
  (µs/s): the difference divided by N, and its ratio to the reference's ("total ratio": of the
  whole CPU ms/s, the empty process's included);
- RSS per connection: (RSS after the settle - RSS of the fresh process) / N;
- wake-ups/s: the server's voluntary context switches over the window (its threads going to
  sleep and being woken: for an event loop, the timers and reads that woke it), a count that
  does not move with the box; pings that share a loop wake-up cost less each;
- the ratio of both to the reference, measured in the same run at the same N: the raw
  `websockets` server of bench/reference.py with its default keepalive (a ping every 20 s,
  as Threadline's gateway).

Servers under test: `embedded` (`--role all`: SQLite, in-process bus, the worker's polls in the
same process), `redis` and `redis-cluster` (`--role gateway`, Postgres, a throwaway redis-server
or a 3-master Redis Cluster). What each periodic task costs is counted, not timed, over the
window: keepalive pings the clients answered; Redis commands by the client that sent them
(`MONITOR` on every node, each command attributed by its connection's client name: the
presence store's refresh and rereads, the bus's health checks and publishes, the connection
limiter's slot refreshes); Postgres transactions of the run's database (token rechecks, the
fallback version poll when the bus is down). Printed per second and per 1 000 connections, so a
task whose count grows with N (rather than with threads or gateways) shows at once. Nothing is
asserted.

`--tree LABEL=DIR` measures each Threadline server again running the code of DIR (a source
tree of another commit, e.g. `git archive main | tar -x -C DIR`; same interpreter and
packages), interleaved in the same run: a before/after comparison beside one reference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py
import fanout  # bench/fanout.py: the descriptor limit
import fanout_compare as compare  # pinning, the reference server, settling
import httpx
import many_threads  # Redis servers and their pids, Postgres transactions
import orjson
import psutil
import redis.asyncio as redis
import wsclient

from server.gc_tuning import parse_gc_log
from tests.e2e import harness

BACKENDS = ("embedded", "redis", "redis-cluster")
# A Postgres backend that stays idle publishes its transaction counts up to 10 s late
# (PGSTAT_IDLE_INTERVAL): a count is read only after this long without setup work.
PG_STATS_DELAY = 11.0
# More environment for every Threadline server (--server-env), e.g. to switch a task off.
SERVER_ENV: dict[str, str] = {}
# Source trees to run Threadline from besides this one (--tree): label -> directory.
TREES: dict[str, Path] = {}
TOKEN_TTL = 3600.0
OPEN_CONCURRENCY = 100


@dataclass
class Bus:
    """What a Threadline server under test is given: storage and (maybe) Redis."""

    name: str
    database_url: str
    redis_url: str | None = None
    redis_nodes: list[str] = field(default_factory=list)  # redis://host:port of each node


@dataclass
class Measured:
    server: str
    connections: int
    cpu_ms_s: float
    empty_ms_s: float  # the same process before any connection
    rss_kib: float
    pings_s: float
    redis: Counter[str] = field(default_factory=Counter)  # "client: COMMAND" -> per second
    xacts_s: float = float("nan")
    closed: int = 0  # connections the server closed during the run
    # Collections per generation in the window (the server's THREADLINE_GC_LOG): count, ns
    gc: dict[int, tuple[int, int]] = field(default_factory=dict)
    wakeups_s: float = 0.0  # the server's voluntary context switches per second

    @property
    def cpu_us_conn(self) -> float:
        """CPU per connection over what the process spends with none."""
        return (self.cpu_ms_s - self.empty_ms_s) * 1000 / self.connections


# --- servers under test ---------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """The process's CPU so far, in ns precision: its threads' run time from schedstat (user
    + system ticks of 10 ms where /proc/PID/task is not there)."""
    total, found = 0, False
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"{task.path}/schedstat", encoding="ascii") as stat,
            ):
                total += int(stat.read().split()[0])
                found = True
    return total / 1e9 if found else compare.cpu_seconds(pid)


def wakeups(pid: int) -> int:
    """How often the process's threads have gone to sleep and been woken so far (voluntary
    context switches): an event loop's is one per wait that blocked, so it counts the timers and
    reads that woke it, whatever the box's speed."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    return total


@contextlib.asynccontextmanager
async def threadline(
    bus: Bus,
    log_dir: Path,
    count: int,
    variant: dict[str, str] | None = None,
    tree: str = "",
) -> AsyncIterator[compare.Peer]:
    extra = {
        "THREADLINE_MAX_CONNECTIONS": str(count + 1000),
        "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1000000",
        "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": "1000000",
        # One client sets everything up: this measures holding connections, not the quotas.
        "THREADLINE_TOKEN_RATE": "100000",
        "THREADLINE_TOKEN_BURST": "100000",
        "THREADLINE_SCOPE_RATE": "100000",
        "THREADLINE_SCOPE_BURST": "100000",
    }
    if bus.redis_url:
        extra["THREADLINE_REDIS_URL"] = bus.redis_url
    extra["THREADLINE_GC_LOG"] = str(log_dir / "gc.log")
    extra.update(SERVER_ENV)
    variant = variant or {}
    extra.update(variant)
    env = harness.server_env(bus.database_url, extra)
    role = "all" if bus.redis_url is None else "gateway"
    root = TREES[tree] if tree else harness.ROOT
    handle = harness.start(role, env, log_dir=log_dir, root=root)
    try:
        compare.pin(handle.process.pid, {compare.SERVER_CORE})
        label = " ".join(
            [
                bus.name,
                *([f"@{tree}"] if tree else []),
                *(f"{k.removeprefix('THREADLINE_')}={v}" for k, v in variant.items()),
            ]
        )
        yield compare.Peer(f"Threadline {label}", handle.process.pid, handle.port, "", b"", "")
    finally:
        handle.stop()


async def mint(database_url: str, people: int) -> list[str]:
    """One token per person (subjects person-0 …), each expiring in TOKEN_TTL."""
    from runtime.domain import Role
    from server.app import open_storage
    from server.auth import create_token

    async with contextlib.AsyncExitStack() as stack:
        store = await open_storage(database_url, stack)
        return [
            await create_token(
                store,
                subject=f"person-{i}",
                role=Role.USER,
                scopes=["bench"],
                expires_in=TOKEN_TTL,
            )
            for i in range(people)
        ]


async def create_threads(port: int, token: str, count: int) -> list[str]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    ) as http:
        return await many_threads.create_threads(http, count)


async def open_connections(
    peer: compare.Peer,
    tally: wsclient.Tally,
    count: int,
    threads: list[str],
    tokens: list[str],
    concurrency: int = OPEN_CONCURRENCY,
) -> list[wsclient.Client]:
    """`count` connections, the i-th subscribed to thread i % T with token i % P, at most
    `concurrency` handshakes at a time."""
    gate = asyncio.Semaphore(concurrency)
    clients: list[wsclient.Client] = []

    async def one(i: int) -> None:
        thread_id = threads[i % len(threads)]
        path = f"/v1/ws?token={tokens[i % len(tokens)]}" if tokens else "/"
        subscribe = orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1})
        async with gate:
            clients.append(
                await wsclient.connect(
                    "127.0.0.1", peer.port, path, tally, subscribe=subscribe, timeout=120
                )
            )

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    except BaseException:
        wsclient.close_all(clients)
        raise
    return clients


# --- counting Redis commands and Postgres transactions ---------------------------------


async def flushed_transactions(database_url: str) -> int:
    """The database's transactions so far, every backend's published (see PG_STATS_DELAY)."""
    await asyncio.sleep(PG_STATS_DELAY)
    return await many_threads.transactions(database_url)


class Monitor:
    """Every command the nodes execute, by '<client name>: <COMMAND>' (MONITOR per node)."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.counts: Counter[str] = Counter()
        self._names: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: list[Any] = []

    async def __aenter__(self) -> Monitor:
        for node in self.nodes:
            client = redis.from_url(node)
            self._clients.append(client)
            if (await client.info("replication")).get("role") != "master":
                continue  # a replica replays its master's writes: counted there already
            for entry in await client.client_list():
                self._names[entry["addr"]] = entry.get("name") or "unnamed"
            self._tasks.append(asyncio.create_task(self._watch(client)))
        await asyncio.sleep(0.2)  # MONITOR is on before the window opens
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for client in self._clients:
            await client.aclose()

    async def _watch(self, client: Any) -> None:
        async with client.monitor() as monitor:
            async for command in monitor.listen():
                address = f"{command.get('client_address')}:{command.get('client_port')}"
                lua = command.get("client_type") == "lua" or address.startswith("lua")
                name = "(inside scripts)" if lua else self._names.get(address, "?")
                verb = str(command.get("command", "")).split(" ", 1)[0].upper()
                self.counts[f"{name}: {verb}"] += 1

    def reset(self) -> None:
        self.counts.clear()


# --- one measurement ------------------------------------------------------------------


async def hold(
    peer: compare.Peer,
    count: int,
    threads: list[str],
    tokens: list[str],
    args: argparse.Namespace,
    bus: Bus | None,
    gc_log: Path | None = None,
) -> Measured:
    process = psutil.Process(peer.pid)
    await compare.settle(peer.pid)
    before = process.memory_info().rss
    # What the process spends with no connection at all (its own timers and polls).
    empty, started = cpu_seconds(peer.pid), time.monotonic()
    await asyncio.sleep(args.window / 2)
    empty = (cpu_seconds(peer.pid) - empty) / (time.monotonic() - started)
    tally = wsclient.Tally()
    opening = time.monotonic()
    clients = await open_connections(peer, tally, count, threads, tokens, args.open_concurrency)
    # How spread the connections' keepalive timers are: pings that fire together share wake-ups.
    print(f"  {peer.name}: {count} opened in {time.monotonic() - opening:.2f} s", file=sys.stderr)
    try:
        await asyncio.sleep(args.settle)
        await compare.settle(peer.pid)
        rss = (process.memory_info().rss - before) / count / 1024
        async with contextlib.AsyncExitStack() as stack:
            monitor = None
            if bus is not None and bus.redis_nodes:
                monitor = await stack.enter_async_context(Monitor(bus.redis_nodes))
            database = bus.database_url if bus is not None else ""
            postgres = database.startswith("postgres")
            xacts = await flushed_transactions(database) if postgres else 0
            pings, started = tally.pings, time.monotonic()
            cpu, woken = cpu_seconds(peer.pid), wakeups(peer.pid)
            if monitor is not None:
                monitor.reset()
            await asyncio.sleep(args.window)
            cpu, woken = cpu_seconds(peer.pid) - cpu, wakeups(peer.pid) - woken
            ended, pinged = time.monotonic(), tally.pings - pings
            elapsed = ended - started
            commands = Counter(
                {k: v / elapsed for k, v in (monitor.counts if monitor else {}).items()}
            )
            if postgres:
                xacts_s = (await flushed_transactions(database) - xacts) / elapsed
            else:
                xacts_s = float("nan")
        closed = sum(1 for c in clients if c.closed.done())
        return Measured(
            peer.name,
            count,
            cpu * 1000 / elapsed,
            empty * 1000,
            rss,
            pinged / elapsed,
            commands,
            xacts_s,
            closed,
            gc_window(gc_log, started, ended),
            woken / elapsed,
        )
    finally:
        wsclient.close_all(clients)


async def measure_reference(count: int, redis_url: str, args: argparse.Namespace) -> Measured:
    thread = f"ref-{os.urandom(4).hex()}"
    async with keepalive_reference(redis_url, thread) as peer:
        return await hold(peer, count, [thread], [], args, None)


@contextlib.asynccontextmanager
async def keepalive_reference(redis_url: str, thread: str) -> AsyncIterator[compare.Peer]:
    """bench/reference.py with its default keepalive, pinned to the server core."""
    port = harness.free_port()
    command = [
        sys.executable,
        str(Path(__file__).with_name("reference.py")),
        *("--port", str(port), "--redis", redis_url, "--channel", f"idle:{thread}"),
        *("--loop", "uvloop", "--keepalive"),
    ]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = await process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"reference server did not start (printed {line!r})")
        compare.pin(process.pid, {compare.SERVER_CORE})
        yield compare.Peer("websockets reference", process.pid, port, "/", b"", thread)
    finally:
        process.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def measure_threadline(
    bus: Bus, count: int, args: argparse.Namespace, variant: dict[str, str], tree: str = ""
) -> Measured:
    log_dir = Path(tempfile.mkdtemp(prefix="threadline-idle-"))
    async with threadline(bus, log_dir, count, variant, tree) as peer:
        tokens = await mint(bus.database_url, min(args.people, count))
        threads = await create_threads(peer.port, tokens[0], args.threads)
        return await hold(peer, count, threads, tokens, args, bus, log_dir / "gc.log")


def gc_window(path: Path | None, start: float, end: float) -> dict[int, tuple[int, int]]:
    """The server's collections in the window, from the file THREADLINE_GC_LOG names."""
    if path is None or not path.exists():
        return {}
    return parse_gc_log(path.read_text(encoding="utf-8"), start, end)


# --- buses ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def buses(names: list[str], admin_dsn: str, redis_url: str) -> AsyncIterator[list[Bus]]:
    """A fresh database per bus (SQLite for embedded); a Redis Cluster when asked for."""
    async with contextlib.AsyncExitStack() as stack:
        made: list[Bus] = []
        for name in names:
            if name == "embedded":
                directory = Path(tempfile.mkdtemp(prefix="threadline-idle-"))
                made.append(Bus(name, harness.sqlite_url(directory)))
                continue
            database = await stack.enter_async_context(common.own_database(admin_dsn))
            if name == "redis":
                made.append(Bus(name, database, redis_url, [redis_url]))
            else:
                url, _ = stack.enter_context(many_threads.redis_cluster())
                nodes = [f"redis://{n}" for n in url.split("://", 1)[1].split(",")]
                made.append(Bus(name, database, url, nodes))
        yield made


# --- the table ------------------------------------------------------------------------


def ratio(ours: float, reference: float) -> str:
    return f"{ours / reference:.2f}x" if reference > 0 else "n/a"


def print_tables(rows: list[Measured], args: argparse.Namespace) -> None:
    cpus = os.cpu_count() or 1
    print(
        f"Idle connections: nothing published, {args.window:g} s window after a "
        f"{args.settle:g} s settle; {args.threads} threads, up to {args.people} people, "
        f"presence on; server pinned to core {compare.SERVER_CORE}, {cpus} CPUs; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}"
    )
    print(
        f"{'conns':>6} {'server':<36} {'CPU ms/s':>9} {'empty':>6} {'us/s/conn':>10}"
        f" {'ratio':>6} {'total ratio':>11}"
        f" {'KiB/conn':>9} {'RSS ratio':>9} {'pings/s':>8} {'wakeups/s':>9} {'Redis cmd/s':>11}"
        f" {'pg xact/s':>9} {'closed':>6}"
    )
    for count in sorted({r.connections for r in rows}):
        reference = next(r for r in rows if r.connections == count and "reference" in r.server)
        for row in (r for r in rows if r.connections == count):
            print(
                f"{count:>6} {row.server:<36} {row.cpu_ms_s:>9.1f} {row.empty_ms_s:>6.1f}"
                f" {row.cpu_us_conn:>10.2f} {ratio(row.cpu_us_conn, reference.cpu_us_conn):>6}"
                f" {ratio(row.cpu_ms_s, reference.cpu_ms_s):>11}"
                f" {row.rss_kib:>9.2f} {ratio(row.rss_kib, reference.rss_kib):>9}"
                f" {row.pings_s:>8.1f} {row.wakeups_s:>9.1f} {sum(row.redis.values()):>11.1f}"
                f" {row.xacts_s:>9.1f} {row.closed:>6}"
            )
    print(
        "\nGarbage collections in the window (THREADLINE_GC_LOG): count and pause per generation,"
    )
    print("and the pauses' share of the server's CPU")
    for row in rows:
        if "reference" in row.server:
            continue
        paused_ms = sum(ns for _, ns in row.gc.values()) / 1e6
        gens = "  ".join(
            f"gen{g} {row.gc.get(g, (0, 0))[0]:>5} x {row.gc.get(g, (0, 0))[1] / 1e6:>7.1f} ms"
            for g in range(3)
        )
        paused_ms_s = paused_ms / args.window
        share = paused_ms_s / row.cpu_ms_s if row.cpu_ms_s > 0 else 0.0
        print(
            f"  {row.connections:>6} {row.server:<36} {gens}"
            f"  {paused_ms_s:>6.1f} ms/s ({share:.0%} of CPU)"
        )
    print("\nPeriodic work per task (counted over the window): per second, and per second per")
    print("1 000 connections (a task that grows with connections keeps its second figure)")
    for row in rows:
        if "reference" in row.server:
            continue
        per_k = 1000 / row.connections
        tasks: list[tuple[str, float]] = [("keepalive pings answered", row.pings_s)]
        tasks += sorted(row.redis.items(), key=lambda item: -item[1])
        if row.xacts_s == row.xacts_s:  # not NaN
            tasks.append(("Postgres transactions (token rechecks, polls)", row.xacts_s))
        for name, rate in tasks:
            print(
                f"  {row.connections:>6} {row.server:<36} {name:<48} {rate:>9.2f}/s"
                f" {rate * per_k:>9.3f}/s/1k"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", default="1000,5000,10000")
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--people", type=int, default=1000, help="tokens (one subject each)")
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--only", default=",".join(BACKENDS))
    parser.add_argument("--postgres", help="admin DSN to create databases (default: own server)")
    parser.add_argument("--redis", help="Redis URL (default: a redis-server of its own)")
    parser.add_argument("--quick", action="store_true", help="200 connections, 3 s + 5 s")
    parser.add_argument(
        "--open-concurrency",
        type=int,
        default=OPEN_CONCURRENCY,
        help="handshakes in flight while opening (fewer spreads the keepalive timers)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more environment for the Threadline servers (repeatable), e.g. to see what one "
        "task costs: THREADLINE_PRESENCE_REFRESH=3600",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="measure each Threadline server again with this environment too, interleaved in "
        "the same run (repeatable), e.g. THREADLINE_GC_FREEZE=false",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="measure each Threadline server again running the code of the source tree DIR "
        "(an absolute path, e.g. an export of main), interleaved in the same run (repeatable)",
    )
    args = parser.parse_args()
    SERVER_ENV.update(item.split("=", 1) for item in args.server_env)
    TREES.update((k, Path(v)) for k, v in (t.split("=", 1) for t in args.tree))
    counts = [int(n) for n in args.connections.split(",") if n]
    variants: list[dict[str, str]] = [{}]
    variants += [dict(p.split("=", 1) for p in v.split(",")) for v in args.variant]
    if args.quick:
        counts, args.settle, args.window = [200], 3.0, 5.0
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown --only {sorted(unknown)}; choose from {BACKENDS}")
    fanout.raise_fd_limit(max(counts) * 2 + 1024)
    compare.pin_self_off_server_core()
    rows: list[Measured] = []
    with common.servers(args.postgres, args.redis) as (admin_dsn, redis_url):
        many_threads.POSTGRES_PORT.append(int(admin_dsn.rsplit(":", 1)[1].split("/")[0]))
        async with buses(names, admin_dsn, redis_url) as made:
            for count in counts:
                print(f"{count} connections: reference ...", file=sys.stderr, flush=True)
                rows.append(await measure_reference(count, redis_url, args))
                runs = len(made) * len(variants) * (1 + len(TREES))
                for bus in made:
                    for variant in variants:
                        for tree in ["", *TREES]:
                            print(
                                f"{count} connections: {bus.name} {tree} {variant} ...",
                                file=sys.stderr,
                            )
                            rows.append(await measure_threadline(bus, count, args, variant, tree))
                for row in rows[-runs - 1 :]:  # what a cut run still shows
                    print(f"  {row}", file=sys.stderr, flush=True)
    print_tables(rows, args)


if __name__ == "__main__":
    common.run(main())
