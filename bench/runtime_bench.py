"""Runtime benchmark: CPU per demo run, runs per second, added latency per chunk (model delta ->
published canonical chunk) and thread-length scaling, with the demo model at zero delay.
Prints its figures; asserts nothing.

    python bench/runtime_bench.py [--quick] [--chunks 400] [--runs 240] [--threads 8]
                            [--seq-runs 40] [--lengths 10,200,2000]
                            [--postgres ADMIN_DSN] [--redis URL] [--scale-out]
                            [--profile FILE] [--profile-scale-out FILE] [--no-split]
                            [--loop uvloop|asyncio] [--worker-loops uvloop,asyncio]

With --postgres the benchmark creates a database of its own through ADMIN_DSN and drops it after.
--scale-out adds the Postgres + Redis column on a throwaway cluster and redis-server of the
run's own (for whichever of --postgres / --redis is not given).

Every figure is measured side by side in one run for the embedded default (SQLite + in-process
bus) and, when given, for Postgres + Redis, so ratios are comparable on a noisy machine.
CPU is this process's (worker, service and the driving client in one process; for Postgres +
Redis the servers' own CPU is not included). On Postgres + Redis the benchmark then also runs
the worker as deployed, in a process of its own (`threadline serve --role worker`), and splits
a run's CPU into the worker's (that process), the admission's (`ThreadService.send_message`,
what a gateway spends on the request that starts the run, measured alone) and the driving
client's (its subscription to the thread's chunks and invalidations, its read of the run),
which in a deployment is a gateway's fan-out and a client's own work, not the run's;
--no-split skips that part. That worker runs on each event loop of --worker-loops in turn
(THREADLINE_EVENT_LOOP), and the ratio of its CPU per run is printed. This process runs on
--loop (uvloop by default, as `threadline serve` does when uvloop is installed).
--profile FILE writes a cProfile of the sequential runs on the 200-message thread (embedded;
the first length without 200) to FILE; --profile-scale-out FILE does the same for the
Postgres + Redis runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["THREADLINE_DEMO_DELAY_MS"] = "0"

import common  # bench/common.py, next to this script

from realtime import open_bus
from realtime.bus import Bus
from realtime.channels import thread_channel
from runtime.agent import Agent
from runtime.demo import demo_agent
from runtime.domain import MessageRole, NewMessage, Principal, Role, RunStatus, TextPart
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.providers.model_api import FinishDelta, ModelDelta, ModelRequest, TextDelta
from runtime.providers.scripted import FunctionModel
from runtime.service.thread_service import ThreadService
from runtime.storage import open_store
from runtime.storage.store import RunChange, StepCommit, Store

PRINCIPAL = Principal(subject="bench", role=Role.USER, scopes=frozenset({"bench"}))
SCOPE = "bench"


async def chunk_latency(store_url: str, redis_url: str | None, chunks: int) -> list[float]:
    """Seconds from a model delta being yielded to its chunk arriving at a bus subscriber."""
    yielded: list[float] = []

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        for i in range(chunks):
            yielded.append(time.perf_counter())
            yield TextDelta(text=f"w{i} ")
            # A model streams: back-to-back deltas would queue behind each other. 1 ms, not
            # less: uvloop's timers have millisecond resolution, and a shorter sleep returns at
            # once until the loop's clock moves, so the deltas came in bursts.
            await asyncio.sleep(0.001)
        yield FinishDelta(reason="stop")

    received: list[float] = []
    agent = Agent(model=FunctionModel(model))
    async with open_store(store_url) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        async with Worker(store, bus, agent):
            thread = await service.create_thread(PRINCIPAL, title="latency")
            thread_id = thread.thread.id
            done = asyncio.Event()

            async def listen() -> None:
                async with bus.subscribe(thread_channel(thread_id)) as subscription:
                    ready.set()
                    async for data in subscription:
                        frame = orjson.loads(data)
                        if frame["type"] == "chunk" and frame["chunk"]["type"] == "text-delta":
                            received.append(time.perf_counter())
                            if len(received) == chunks:
                                done.set()

            ready = asyncio.Event()
            listener = asyncio.create_task(listen())
            await ready.wait()
            admission = await service.send_message(PRINCIPAL, thread_id, "go")
            await asyncio.wait_for(done.wait(), 120)
            listener.cancel()
            # The run's end too: a worker leaving a run unfinished hands it back, and the next
            # worker on this database would take it over, streaming in another measurement.
            assert admission.run_id is not None
            await wait_ended(store, [admission.run_id])
    return [r - y for y, r in zip(yielded, received, strict=True)]


async def prefill(store: Store, thread_id: str, messages: int) -> None:
    """Grow an idle thread to `messages` messages (alternating user and assistant text) through
    the store's own fenced commits, quickly: one run appends them in batches."""
    if messages <= 0:
        return
    admission = await store.submit_input(thread_id, [SCOPE], text="q0", submitted_by="bench")
    assert admission.run_id is not None
    lease = await store.acquire_run_lease(admission.run_id, "bench-prefill", 60.0)
    assert lease is not None
    await store.start_episode(lease)
    made = 1
    while made < messages:
        batch = []
        for n in range(made, min(messages, made + 100)):
            role = MessageRole.USER if n % 2 == 0 else MessageRole.ASSISTANT
            words = f"{'question' if n % 2 == 0 else 'answer'} number {n} " * 4
            batch.append(NewMessage(role=role, parts=(TextPart(text=words),)))
        made += len(batch)
        last = made >= messages
        change = RunChange(status=RunStatus.COMPLETED) if last else None
        await store.commit(lease, StepCommit(append=tuple(batch), run=change))
    if messages == 1:
        await store.commit(lease, StepCommit(run=RunChange(status=RunStatus.COMPLETED)))
    await store.release_lease(lease)


async def until_ended(frames: AsyncIterator[bytes], store: Store, run_id: str, after: int) -> None:
    """Like a client: wait for invalidations, and read the run once one is recent enough for an
    echo run to have ended (the start, then the step's commit, which carries the completion:
    the demo agent has no after_step hook; a later one is read too if the run had not)."""
    async with asyncio.timeout(30):  # one deadline per run, not one timer per frame
        while True:
            frame = orjson.loads(await anext(frames))
            if frame["type"] != "invalidate" or frame["version"] < after + 2:
                continue
            if (await store.get_run(run_id)).status.is_terminal:
                return


async def drive(service: ThreadService, bus: Bus, store: Store, thread_id: str, runs: int) -> int:
    """`runs` demo runs one after another on one thread; returns how many ended."""
    async with bus.subscribe(thread_channel(thread_id)) as subscription:
        frames = aiter(subscription)
        for n in range(runs):
            admission = await service.send_message(PRINCIPAL, thread_id, f"hello number {n}")
            assert admission.run_id is not None
            await until_ended(frames, store, admission.run_id, admission.version)
    return runs


@dataclass
class Sequential:
    length: int
    cpu_ms: float  # process CPU per run
    wall_ms: float  # wall time per run


async def sequential_runs(
    store_url: str,
    redis_url: str | None,
    lengths: list[int],
    runs: int,
    profile: cProfile.Profile | None = None,
) -> list[Sequential]:
    """Per thread length: CPU and wall time per run, runs one at a time. The runs are spread
    over threads of that length, ten per thread, so a thread grows by at most 20 messages."""
    agent = demo_agent()
    rows = []
    async with open_store(store_url) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        for length in lengths:
            threads = []
            for i in range(max(1, runs // 10)):
                thread = await service.create_thread(PRINCIPAL, title=f"len{length}-{i}")
                await prefill(store, thread.thread.id, length)
                threads.append(thread.thread.id)
            async with Worker(store, bus, agent):
                # One warm-up run per thread (first queries, caches), not measured.
                for thread_id in threads:
                    await drive(service, bus, store, thread_id, 1)
                share = max(1, runs // len(threads))
                profiled = 200 if 200 in lengths else lengths[0]
                profiling = profile is not None and length == profiled
                cpu, wall = time.process_time(), time.perf_counter()
                if profiling:
                    assert profile is not None
                    profile.enable()
                for thread_id in threads:
                    await drive(service, bus, store, thread_id, share)
                if profiling:
                    assert profile is not None
                    profile.disable()
                done = share * len(threads)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            rows.append(Sequential(length, cpu / done * 1e3, wall / done * 1e3))
    return rows


async def runs_per_second(
    store_url: str, redis_url: str | None, runs: int, threads: int
) -> tuple[float, int, float]:
    """(runs/s, runs, process CPU ms per run) with `threads` threads running concurrently."""
    agent = demo_agent()
    async with open_store(store_url) as store, open_bus(redis_url, prefix="bench:") as bus:
        service = ThreadService(store, Publisher(bus), agent)
        async with Worker(store, bus, agent, max_concurrent_runs=threads):
            ids = [
                (await service.create_thread(PRINCIPAL, title=f"t{i}")).thread.id
                for i in range(threads)
            ]
            await asyncio.gather(*(drive(service, bus, store, t, 1) for t in ids))  # warm-up
            per_thread = max(1, runs // threads)
            cpu, started = time.process_time(), time.perf_counter()
            total = sum(
                await asyncio.gather(*(drive(service, bus, store, t, per_thread) for t in ids))
            )
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return total / elapsed, total, cpu / total * 1e3


@dataclass
class Split:
    """CPU ms per run with the worker in a process of its own."""

    label: str
    runs: int
    worker_ms: float  # the worker process's CPU
    driver_ms: float  # this process's: admissions, the client's subscription and reads
    admission_ms: float  # one admission alone (`ThreadService.send_message`)
    rate: float  # runs/s

    @property
    def run_ms(self) -> float:
        """What a run costs the deployment: its worker's CPU and its admission's."""
        return self.worker_ms + self.admission_ms

    @property
    def client_ms(self) -> float:
        return self.driver_ms - self.admission_ms


def process_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def wait_ended(store: Store, run_ids: list[str], polls: int = 1200) -> None:
    """Until every run has ended (checked every 50 ms, at most `polls` times)."""
    waiting = list(run_ids)
    for _ in range(polls):
        waiting = [r for r in waiting if not (await store.get_run(r)).status.is_terminal]
        if not waiting:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{len(waiting)} runs did not end")


async def split_runs(
    database_url: str,
    redis_url: str,
    length: int,
    seq_runs: int,
    runs: int,
    threads: int,
    loop: str,
) -> list[Split]:
    """The worker as deployed (`threadline serve --role worker`, on event loop `loop`) and this
    process as the gateway and client: each one's CPU per run on `length`-message threads, one
    run at a time and on `threads` threads at once."""
    agent = demo_agent()
    # The served worker's bus prefix and polling: the defaults.
    async with open_store(database_url) as store, open_bus(redis_url) as bus:
        service = ThreadService(store, Publisher(bus), agent)
        # Admissions alone, before any worker runs: one per fresh thread (each starts a run,
        # which waits for the worker below; those runs are its warm-up).
        fresh = [
            (await service.create_thread(PRINCIPAL, title=f"admit{i}")).thread.id
            for i in range(max(20, seq_runs))
        ]
        cpu = time.process_time()
        admitted = [
            await service.send_message(PRINCIPAL, thread_id, "hello") for thread_id in fresh
        ]
        admission_ms = (time.process_time() - cpu) / len(fresh) * 1e3
        sequential = []
        for i in range(max(1, seq_runs // 10)):
            thread = await service.create_thread(PRINCIPAL, title=f"split{length}-{i}")
            await prefill(store, thread.thread.id, length)
            sequential.append(thread.thread.id)
        concurrent = []
        for i in range(threads):
            thread = await service.create_thread(PRINCIPAL, title=f"splitc{i}")
            await prefill(store, thread.thread.id, length)
            concurrent.append(thread.thread.id)
        extra = {
            "THREADLINE_POLL_INTERVAL": "1.0",
            "THREADLINE_MAX_CONCURRENT_RUNS": "16",
            "THREADLINE_EVENT_LOOP": loop,
        }
        with common.deployment(database_url, redis_url, ["worker"], extra) as (worker,):
            pid = worker.process.pid
            await wait_ended(store, [a.run_id for a in admitted if a.run_id is not None])
            for thread_id in sequential + concurrent:  # warm-up: a first run on each
                await drive(service, bus, store, thread_id, 1)
            rows = []
            share = max(1, seq_runs // len(sequential))
            per_thread = max(1, runs // threads)
            for label, ids, each in (
                (f"{loop}: sequential, {length} messages", sequential, share),
                (f"{loop}: {threads} threads at once, {length} messages", concurrent, per_thread),
            ):
                worker_cpu, cpu = process_cpu(pid), time.process_time()
                started = time.perf_counter()
                if ids is sequential:
                    for thread_id in ids:
                        await drive(service, bus, store, thread_id, each)
                else:
                    await asyncio.gather(*(drive(service, bus, store, t, each) for t in ids))
                elapsed = time.perf_counter() - started
                done = each * len(ids)
                rows.append(
                    Split(
                        label,
                        done,
                        (process_cpu(pid) - worker_cpu) / done * 1e3,
                        (time.process_time() - cpu) / done * 1e3,
                        admission_ms,
                        done / elapsed,
                    )
                )
    return rows


def parse_lengths(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts, for the smoke test")
    parser.add_argument("--chunks", type=int, default=400)
    parser.add_argument("--runs", type=int, default=240, help="runs for runs/s (concurrent)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seq-runs", type=int, default=40, help="sequential runs per length")
    parser.add_argument("--lengths", type=parse_lengths, default=[10, 200, 2000])
    parser.add_argument("--postgres", help="DSN of a database to use for the scale-out column")
    parser.add_argument("--redis", help="Redis URL for the scale-out column")
    parser.add_argument(
        "--scale-out", action="store_true", help="own Postgres/Redis for the scale-out column"
    )
    parser.add_argument(
        "--no-split", action="store_true", help="skip the worker-in-its-own-process part"
    )
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="this process's event loop (`threadline serve` takes uvloop when installed)",
    )
    parser.add_argument(
        "--worker-loops",
        default="uvloop,asyncio",
        help="event loops of the served worker in the split part, side by side",
    )
    parser.add_argument("--profile", help="write a cProfile of the embedded 200-message runs")
    parser.add_argument(
        "--profile-scale-out", help="write a cProfile of the Postgres + Redis 200-message runs"
    )
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.runs, args.seq_runs = 60, 24, 10
    return args


async def main(args: argparse.Namespace) -> None:
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if args.scale_out:
            args.postgres, args.redis = stack.enter_context(
                common.servers(args.postgres, args.redis)
            )
        setups: list[tuple[str, str, str | None]] = [
            ("sqlite+memory", f"sqlite:///{tmp}/bench.db", None)
        ]
        if args.postgres:
            dsn = await stack.enter_async_context(common.own_database(args.postgres))
            setups.append(("postgres+redis", dsn, args.redis))
        profiles = {
            "sqlite+memory": (args.profile, cProfile.Profile() if args.profile else None),
            "postgres+redis": (
                args.profile_scale_out,
                cProfile.Profile() if args.profile_scale_out else None,
            ),
        }
        throughput: list[str] = []
        scaling: dict[str, list[Sequential]] = {}
        for name, store_url, redis_url in setups:
            latencies = await chunk_latency(store_url, redis_url, args.chunks)
            rate, total, cpu = await runs_per_second(store_url, redis_url, args.runs, args.threads)
            p50 = statistics.median(latencies) * 1e6
            p99 = common.pct(latencies, 0.99) * 1e6
            throughput.append(
                f"{name:16} {p50:13.0f} {p99:13.0f} {rate:9.1f} {cpu:12.2f}  ({total} runs,"
                f" {args.threads} threads)"
            )
            scaling[name] = await sequential_runs(
                store_url, redis_url, args.lengths, args.seq_runs, profiles[name][1]
            )
        print(
            f"{'setup':16} {'chunk p50 µs':>13} {'chunk p99 µs':>13} {'runs/s':>9}"
            f" {'CPU ms/run':>12}"
        )
        print("\n".join(throughput))
        print()
        print("sequential runs by thread length (messages before the run): CPU ms/run, wall ms/run")
        names = list(scaling)
        print(f"{'messages':>8} " + " ".join(f"{n + ' CPU':>20} {n + ' wall':>20}" for n in names))
        for i, length in enumerate(args.lengths):
            cells = " ".join(
                f"{scaling[n][i].cpu_ms:20.2f} {scaling[n][i].wall_ms:20.2f}" for n in names
            )
            print(f"{length:8d} {cells}")
        if args.postgres and args.redis and not args.no_split:
            dsn = await stack.enter_async_context(common.own_database(args.postgres))
            length = 200 if 200 in args.lengths else args.lengths[0]
            loops = [name for name in args.worker_loops.split(",") if name]
            split: dict[str, list[Split]] = {}
            for loop in loops:
                split[loop] = await split_runs(
                    dsn, args.redis, length, args.seq_runs, args.runs, args.threads, loop
                )
            print()
            print(
                "Postgres + Redis, the worker in a process of its own (serve --role worker):"
                " CPU ms per run"
            )
            print(f"{'':45} {'worker':>8} {'admission':>10} {'run':>8} {'client':>8} {'runs/s':>8}")
            for rows in split.values():
                for row in rows:
                    print(
                        f"{row.label:45} {row.worker_ms:8.2f} {row.admission_ms:10.2f}"
                        f" {row.run_ms:8.2f} {row.client_ms:8.2f} {row.rate:8.1f}"
                        f"  ({row.runs} runs)"
                    )
            if len(loops) == 2:
                first, second = (split[loop] for loop in loops)
                ratios = ", ".join(
                    f"{a.worker_ms / b.worker_ms:.2f}x" for a, b in zip(first, second, strict=True)
                )
                print(
                    f"worker CPU per run, {loops[0]} / {loops[1]} (sequential, concurrent):"
                    f" {ratios}"
                )
            print(
                "run = worker + admission (the gateway's send_message); client = the driving"
                " client's subscription and reads (a gateway's fan-out in a deployment)"
            )
        for path, profile in profiles.values():
            if path and profile is not None:
                profile.dump_stats(path)
                print(f"\nprofile written to {path}", file=sys.stderr)


if __name__ == "__main__":
    arguments = parse_args()
    common.run(main(arguments), loop=arguments.loop)
