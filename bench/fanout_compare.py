"""Threadline's gateway beside a raw `websockets` + Redis reference (bench/reference.py).

Both servers get the same load from the same clients (bench/wsclient.py) in one run: one
process under test, pinned to core 0 where the box has two (this process, the clients, the
publisher, Redis and Postgres on the others); chunks published with
`runtime.engine.publisher.Publisher.chunk` (a publish and a replay append per chunk, as a
worker does) on the thread's channel, to which the reference subscribes as well; ~200-byte
chunk frames.

Per server: RSS per idle subscribed connection (fresh process, psutil, cumulative counts),
then rate steps of N subscribers x R messages/s for a few seconds each: server CPU µs per
delivery (user + system from /proc over the step), publish -> receipt p50/p99/p99.9, the share
delivered within the step plus a grace period, and the CPU this client process used (when it
nears one core the client, not the server, is the limit). Steps stop at the first one under
97 % delivered: "kept up to" is the last step at or above it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import common  # bench/common.py, next to this script
import httpx
import orjson
import psutil
import wsclient

from realtime import open_bus
from realtime.channels import thread_channel
from runtime.engine.publisher import Publisher
from tests.e2e import harness

SERVER_CORE = 0
KEPT_UP = 0.97
GRACE = 2.0
PAYLOAD_BYTES = 200


def cores() -> set[int]:
    return set(range(os.cpu_count() or 1))


def pin(pid: int, to: set[int]) -> None:
    """Pin `pid` to the cores `to` where the box has more than one."""
    if len(cores()) >= 2:
        os.sched_setaffinity(pid, to)


def pin_self_off_server_core() -> None:
    """This process, and what it starts from now on, on every core but the server's."""
    pin(0, cores() - {SERVER_CORE})


@dataclass
class Peer:
    """A running server under test."""

    name: str
    pid: int
    port: int
    path: str
    subscribe: bytes
    thread_id: str


@dataclass
class Step:
    subscribers: int
    rate: int
    published: int
    deliveries: int
    cpu_us: float  # server CPU per delivery
    p50: float
    p99: float
    p999: float
    client_cpu: float  # share of one core this process used
    delivered: float = field(init=False)

    def __post_init__(self) -> None:
        expected = self.published * self.subscribers
        self.delivered = self.deliveries / expected if expected else 0.0


@dataclass
class Result:
    name: str
    deflate: bool
    idle: list[tuple[int, float]] = field(default_factory=list)  # (connections, KiB each)
    steps: list[Step] = field(default_factory=list)

    @property
    def kept_up(self) -> float:
        """Deliveries/s of the last step delivered at >= 97 %."""
        good = [s.rate * s.subscribers for s in self.steps if s.delivered >= KEPT_UP]
        return float(max(good)) if good else 0.0


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def pct(values: list[int], q: float) -> float:
    return common.pct(values, q) / 1e6 if values else float("nan")


# --- servers under test ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def threadline(
    database_url: str, redis_url: str, deflate: bool, log_dir: Path, loop: str
) -> AsyncIterator[Peer]:
    env = harness.server_env(
        database_url,
        {
            "THREADLINE_REDIS_URL": redis_url,
            "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1000000",
            "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": "1000000",
            "THREADLINE_WS_PER_MESSAGE_DEFLATE": "true" if deflate else "false",
            "THREADLINE_EVENT_LOOP": loop,
        },
    )
    handle = harness.start("gateway", env, log_dir=log_dir)
    try:
        pin(handle.process.pid, {SERVER_CORE})
        token = harness.create_token(env, "bench", "user", "bench")
        async with httpx.AsyncClient(
            base_url=handle.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http:
            created = await http.post("/v1/threads", json={"title": "fan-out compare"})
            thread_id = created.json()["thread"]["id"]
        subscribe = orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1})
        yield Peer(
            "Threadline gateway",
            handle.process.pid,
            handle.port,
            f"/v1/ws?token={token}",
            subscribe,
            thread_id,
        )
    finally:
        handle.stop()


@contextlib.asynccontextmanager
async def reference(
    redis_url: str, deflate: bool, thread_id: str, loop: str
) -> AsyncIterator[Peer]:
    port = harness.free_port()
    channel = "threadline:" + thread_channel(thread_id)  # the bus's default prefix
    command = [
        sys.executable,
        str(Path(__file__).with_name("reference.py")),
        "--port",
        str(port),
        "--redis",
        redis_url,
        "--channel",
        channel,
        "--loop",
        loop,
    ]
    process = await asyncio.create_subprocess_exec(
        *command, *(["--deflate"] if deflate else []), stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = await process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"reference server did not start (printed {line!r})")
        pin(process.pid, {SERVER_CORE})
        subscribe = orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1})
        yield Peer("websockets + Redis reference", process.pid, port, "/", subscribe, thread_id)
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


# --- measurement ----------------------------------------------------------------------


async def idle_rss(
    peer: Peer, tally: wsclient.Tally, counts: list[int], deflate: bool
) -> tuple[list[wsclient.Client], list[tuple[int, float]]]:
    """Open connections cumulatively; (count, KiB per connection) at each count."""
    process = psutil.Process(peer.pid)
    await asyncio.sleep(0.5)
    before = process.memory_info().rss
    clients: list[wsclient.Client] = []
    rows = []
    for count in sorted(counts):
        clients += await wsclient.connect_many(
            count - len(clients),
            "127.0.0.1",
            peer.port,
            peer.path,
            tally,
            subscribe=peer.subscribe,
            deflate=deflate,
        )
        # Idle means settled: the server finished what the subscriptions started (presence
        # joins and their diffs), whose in-flight state is not what a connection holds.
        await settle(peer.pid)
        rows.append((count, (process.memory_info().rss - before) / count / 1024))
    return clients, rows


async def step(
    peer: Peer,
    publish: Callable[[int], object],
    tally: wsclient.Tally,
    subscribers: int,
    rate: int,
    duration: float,
) -> Step:
    """`rate` messages/s for `duration` s; waits (bounded) until every delivery arrived."""
    loop = asyncio.get_running_loop()
    count = max(1, round(rate * duration))
    server_before, client_before = cpu_seconds(peer.pid), time.process_time()
    wall_before = time.monotonic()
    tally.reset(expect=count * subscribers)
    started = loop.time()
    for index in range(count):
        delay = started + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await publish(index)  # type: ignore[misc]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(GRACE):
            await tally.all_in.wait()
    server = cpu_seconds(peer.pid) - server_before
    client = (time.process_time() - client_before) / (time.monotonic() - wall_before)
    latencies = tally.latencies
    await asyncio.sleep(0.2)  # stragglers of this step must not count in the next
    return Step(
        subscribers,
        rate,
        count,
        tally.deliveries,
        server / max(1, tally.deliveries) * 1e6,
        pct(latencies, 0.5),
        pct(latencies, 0.99),
        pct(latencies, 0.999),
        client,
    )


@dataclass
class Subject:
    """A server under test with its subscribed clients and its results so far."""

    peer: Peer
    result: Result
    tally: wsclient.Tally
    clients: list[wsclient.Client]
    seq: int = 0

    @property
    def active(self) -> bool:
        return not self.result.steps or self.result.steps[-1].delivered >= KEPT_UP


async def subscribed(peer: Peer, deflate: bool, subscribers: int, idle: list[int]) -> Subject:
    """Idle RSS on the fresh server, then `subscribers` connections kept for the steps."""
    tally = wsclient.Tally()
    clients, rows = await idle_rss(peer, tally, sorted({*idle, subscribers}), deflate)
    wsclient.close_all(clients[subscribers:])
    return Subject(peer, Result(peer.name, deflate, rows), tally, clients[:subscribers])


async def steps(
    subjects: list[Subject],
    publisher: Publisher,
    subscribers: int,
    rates: list[int],
    duration: float,
) -> None:
    """Each rate step for each subject in turn (paired under the same background load); a
    subject leaves after its first step under 97 % delivered."""
    pad = "x" * (PAYLOAD_BYTES - 150)
    run_id = f"run-{os.urandom(4).hex()}"
    for subject in subjects:
        await settle(subject.peer.pid)
    for rate in rates:
        for subject in [s for s in subjects if s.active]:

            async def publish(_: int, subject: Subject = subject) -> None:
                chunk = {"type": "text-delta", "delta": f"{pad}t={time.monotonic_ns()}"}
                await publisher.chunk(subject.peer.thread_id, run_id, subject.seq, chunk)
                subject.seq += 1

            done = await step(subject.peer, publish, subject.tally, subscribers, rate, duration)
            subject.result.steps.append(done)
            print(
                f"  {subject.peer.name}{' (deflate)' if subject.result.deflate else ''}: "
                f"{subscribers} x {rate}/s: {done.delivered:.1%} delivered, "
                f"{done.cpu_us:.1f} µs/delivery, p99 {done.p99:.1f} ms, "
                f"client {done.client_cpu:.0%} of a core",
                file=sys.stderr,
                flush=True,
            )


async def settle(pid: int, limit: float = 60.0) -> None:
    """Until the server is quiet (< 5 % of a core over half a second; bounded): what the
    subscriptions started (presence joins and their diffs) must not count in the first step."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        await asyncio.sleep(0.5)
        if cpu_seconds(pid) - before < 0.025:
            return


# --- the run and its table ------------------------------------------------------------


async def run(args: argparse.Namespace, database_url: str, redis_url: str) -> None:
    rates = [int(n) for n in args.rates.split(",") if n]
    subscribers, idle = args.compare_subscribers, list(args.compare_idle)
    log_dir = Path(tempfile.mkdtemp(prefix="threadline-bench-"))
    results: list[Result] = []
    bus = open_bus(redis_url)
    await bus.open()
    try:
        publisher = Publisher(bus)
        # Deflate offered and accepted: the first rate step and the idle memory only.
        for deflate, step_rates in ((False, rates), (True, rates[:1])):
            async with (
                reference(redis_url, deflate, f"ref-{os.urandom(4).hex()}", args.loop) as ref,
                threadline(database_url, redis_url, deflate, log_dir, args.loop) as ours,
            ):
                subjects = [
                    await subscribed(peer, deflate, subscribers, idle) for peer in (ref, ours)
                ]
                try:
                    await steps(subjects, publisher, subscribers, step_rates, args.step_seconds)
                finally:
                    for subject in subjects:
                        wsclient.close_all(subject.clients)
                results += [subject.result for subject in subjects]
    finally:
        await bus.close()
    print_table(results, subscribers, rates[0], os.cpu_count() or 1)


def print_table(results: list[Result], subscribers: int, first_rate: int, cpus: int) -> None:
    counts = sorted({n for r in results for n, _ in r.idle})
    pinned = "server pinned to core 0" if cpus >= 2 else "one core shared"
    print(
        f"Fan-out beside the reference: {subscribers} subscribers of one thread, "
        f"~{PAYLOAD_BYTES}-byte chunks via Publisher.chunk, {cpus} CPUs, {pinned}"
    )
    print(
        f"{'system':<30} {'deflate':>7} {'CPU µs/delivery':>15} "
        f"{f'p50 ms @{first_rate}/s':>12} {'p99 ms':>7} {'p99.9 ms':>8} "
        f"{'kept up /s':>10} {'client core':>11} "
        + " ".join(f"{f'KiB/conn @{n}':>14}" for n in counts)
    )
    rows = {(r.name, r.deflate): r for r in results}
    for deflate in (False, True):
        pair = [
            rows.get(("websockets + Redis reference", deflate)),
            rows.get(("Threadline gateway", deflate)),
        ]
        for result in pair:
            if result is not None:
                print(row(result, counts))
        if None not in pair:
            print(ratio_row(pair[0], pair[1], counts))  # type: ignore[arg-type]


def cpu_per_delivery(result: Result) -> float:
    """Server CPU per delivery over the steps that kept up (weighted by deliveries)."""
    good = [s for s in result.steps if s.delivered >= KEPT_UP] or result.steps[:1]
    total = sum(s.deliveries for s in good)
    return sum(s.cpu_us * s.deliveries for s in good) / total if total else float("nan")


def row(result: Result, counts: list[int]) -> str:
    first = result.steps[0]
    idle = dict(result.idle)
    if result.deflate:
        kept = f"{'-':>10}"  # one step only: not stepped
    elif result.kept_up:
        kept = f"{result.kept_up:>10.0f}"
    else:  # not even the first step kept up
        kept = f"{f'<{first.rate * first.subscribers}':>10}"
    return (
        f"{result.name:<30} {'yes' if result.deflate else 'no':>7} "
        f"{cpu_per_delivery(result):>15.1f} {first.p50:>12.2f} {first.p99:>7.2f} "
        f"{first.p999:>8.2f} {kept} "
        f"{max(s.client_cpu for s in result.steps):>11.0%} "
        + " ".join(f"{idle.get(n, float('nan')):>14.1f}" for n in counts)
    )


def ratio_row(reference: Result, ours: Result, counts: list[int]) -> str:
    def r(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    first_ref, first = reference.steps[0], ours.steps[0]
    ref_idle, idle = dict(reference.idle), dict(ours.idle)
    kept = r(ours.kept_up, reference.kept_up) if len(ours.steps) > 1 else "-"
    return (
        f"{'ratio Threadline / reference':<30} {'':>7} "
        f"{r(cpu_per_delivery(ours), cpu_per_delivery(reference)):>15} "
        f"{r(first.p50, first_ref.p50):>12} {r(first.p99, first_ref.p99):>7} "
        f"{r(first.p999, first_ref.p999):>8} {kept:>10} {'':>11} "
        + " ".join(f"{r(idle.get(n, 0), ref_idle.get(n, 0)):>14}" for n in counts)
    )
