"""Many live runs benchmark: one worker process streaming 100 / 500 / 2 000 runs at once whose
scripted model yields a token every 50 ms (20 tokens/s, mostly waiting, as real models do);
chunk latency from the model to the tab, and the worker's memory per active run. Prints;
asserts nothing.

    python bench/live_runs.py [--runs 100,500,2000] [--tokens 100] [--interval-ms 50]
                              [--scopes 1] [--postgres ADMIN_DSN] [--redis URL] [--quick]

A `--role gateway` and a `--role worker` process (uvloop, as served) on Postgres + Redis
(throwaway servers unless given), the worker allowed as many concurrent runs as asked for.
Per step: as many threads, each watched by one lean websocket (bench/wsclient.py) on the
gateway; then one message per thread over HTTP (50 in flight), each starting a run of
bench/scripted_agent.py's `paced_agent`. Every token's text ends with the worker's
`time.monotonic_ns()` when the model yielded it; the client's receipt minus that stamp is the
chunk's latency (model -> worker -> Redis -> gateway -> websocket -> this process; one
system-wide clock). While the runs stream, the worker's RSS is sampled every 0.25 s: memory per
active run is (its peak - its RSS before the step) / the most runs active at once (a run is
active from its first to its last token received). With `--scopes N` the threads are spread
over N scopes (tenants), one token holding them all: admissions of one scope are serialised by
the per-scope run cap's lock, so one scope admits its runs one transaction at a time.

The client is one process reading every chunk (N x 20 per second): compare its CPU with the
servers' before reading the latencies as theirs.
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
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api  # bench/api.py, next to this script
import common  # bench/common.py, next to this script
import fanout  # bench/fanout.py: the descriptor limit
import wsclient  # bench/wsclient.py, next to this script

from tests.e2e import harness


@dataclass
class Row:
    runs: int
    chunks: int
    p50_ms: float
    p99_ms: float
    peak_active: int
    rss_idle_mib: float
    per_run_kib: float
    cpu_s: dict[str, float]
    wall_s: float
    ramp_s: float  # until every run's message was answered (202)


def active(clients: list[CountingClient], tokens: int) -> int:
    """Runs active now: each connection watches one thread, so its deliveries are its run's
    tokens received so far."""
    return sum(1 for client in clients if 0 < client.received < tokens)


class CountingClient(wsclient.Client):
    """A lean client that also counts its own deliveries (its one run's tokens)."""

    received = 0

    def _frame(self, first: int, payload: bytes) -> None:
        before = self.tally.deliveries
        super()._frame(first, payload)
        if self.tally.deliveries != before:
            self.received += 1


async def connect_watchers(
    gateway: harness.ServerHandle, token: str, thread_ids: list[str], tally: wsclient.Tally
) -> list[CountingClient]:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(100)
    path = f"/v1/ws?token={token}"
    clients: list[CountingClient] = []

    async def one(thread_id: str) -> None:
        async with gate:
            _, client = await loop.create_connection(
                lambda: CountingClient(tally, path, f"127.0.0.1:{gateway.port}", False),
                "127.0.0.1",
                gateway.port,
            )
            clients.append(client)
            async with asyncio.timeout(60):
                await client.opened
                client.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id}))
                await client.subscribed

    await asyncio.gather(*(one(t) for t in thread_ids))
    return clients


async def step(
    gateway: harness.ServerHandle,
    worker: harness.ServerHandle,
    http: httpx.AsyncClient,
    token: str,
    runs: int,
    tokens: int,
    scopes: list[str],
) -> Row:
    gate = asyncio.Semaphore(50)

    async def create(n: int) -> str:
        async with gate:
            body = {"title": f"live {n}", "scope": scopes[n % len(scopes)]}
            answer = await http.post("/v1/threads", json=body)
            return str(answer.json()["thread"]["id"])

    thread_ids = list(await asyncio.gather(*(create(n) for n in range(runs))))
    tally = wsclient.Tally()
    tally.reset(expect=runs * tokens)
    clients = await connect_watchers(gateway, token, thread_ids, tally)
    processes = {
        "client": psutil.Process(),
        "gateway": psutil.Process(gateway.process.pid),
        "worker": psutil.Process(worker.process.pid),
    }
    try:
        idle = processes["worker"].memory_info().rss
        cpu = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
        started = time.perf_counter()

        async def send(thread_id: str) -> None:
            async with gate:
                answer = await http.post(f"/v1/threads/{thread_id}/messages", json={"text": "go"})
                if answer.status_code != 202:
                    raise RuntimeError(f"send: {answer.status_code} {answer.text[:200]}")

        sent_at: list[float] = []
        sending = asyncio.gather(*(send(t) for t in thread_ids))
        sending.add_done_callback(lambda _: sent_at.append(time.perf_counter() - started))
        peak, peak_active = idle, 0
        deadline = time.monotonic() + 120 + tokens * 0.2
        while not tally.all_in.is_set() and time.monotonic() < deadline:  # bounded
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(tally.all_in.wait()), 0.25)
            peak = max(peak, processes["worker"].memory_info().rss)
            peak_active = max(peak_active, active(clients, tokens))
        await sending
        wall = time.perf_counter() - started
        used = {name: sum(p.cpu_times()[:2]) - cpu[name] for name, p in processes.items()}
    finally:
        wsclient.close_all(list(clients))
    latencies = [ns / 1e6 for ns in tally.latencies]
    return Row(
        runs,
        tally.deliveries,
        common.pct(latencies, 0.5),
        common.pct(latencies, 0.99),
        peak_active,
        idle / 2**20,
        (peak - idle) / max(1, peak_active) / 1024,
        used,
        wall,
        sent_at[0] if sent_at else wall,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="100,500,2000")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per run")
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--scopes", type=int, default=1, help="tenants the threads spread over")
    parser.add_argument("--postgres", help="admin DSN (a database is made)")
    parser.add_argument("--redis")
    parser.add_argument(
        "--profile-dir", type=Path, help="py-spy raw profiles of the gateway and the worker"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 runs, 10 tokens")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.tokens, args.interval_ms = "20", 10, 10.0
    counts = [int(n) for n in args.runs.split(",") if n]
    fanout.raise_fd_limit(2 * max(counts) + 1000)
    extra = api.agent_env(
        "paced_agent",
        {
            "BENCH_TOKENS": str(args.tokens),
            "BENCH_TOKEN_INTERVAL_MS": str(args.interval_ms),
            "THREADLINE_MAX_CONCURRENT_RUNS": str(max(counts)),
            "THREADLINE_SCOPE_MAX_ACTIVE_RUNS": str(max(counts) * 2),
        },
    )
    rows = []
    with common.servers(args.postgres, args.redis) as (postgres, redis):
        async with common.own_database(postgres) as dsn:
            with common.deployment(dsn, redis, ["gateway", "worker"], extra) as (gateway, worker):
                scopes = [f"bench{n}" for n in range(max(1, args.scopes))]
                token = gateway.token(scopes)
                headers = {"Authorization": f"Bearer {token}"}
                async with httpx.AsyncClient(
                    base_url=gateway.url, headers=headers, timeout=120
                ) as http:
                    with api.profiled([gateway, worker], args.profile_dir):
                        for count in counts:
                            row = await step(
                                gateway, worker, http, token, count, args.tokens, scopes
                            )
                            rows.append(row)
    print(
        f"{'runs':>5} {'chunks':>7} {'p50 ms':>8} {'p99 ms':>8} {'peak active':>11}"
        f" {'worker MiB idle':>15} {'KiB/active run':>14} {'wall s':>7} {'sent s':>7}"
        "  CPU s client/gw/worker  (µs per chunk)"
    )
    for row in rows:
        names = ("client", "gateway", "worker")
        cpu = "/".join(f"{row.cpu_s[k]:.1f}" for k in names)
        per_chunk = "/".join(f"{row.cpu_s[k] / max(1, row.chunks) * 1e6:.0f}" for k in names)
        print(
            f"{row.runs:5d} {row.chunks:7d} {row.p50_ms:8.2f} {row.p99_ms:8.2f}"
            f" {row.peak_active:11d} {row.rss_idle_mib:15.1f} {row.per_run_kib:14.1f}"
            f" {row.wall_s:7.1f} {row.ramp_s:7.1f}  {cpu}  ({per_chunk})"
        )
    print(
        f"({args.tokens} tokens per run, {args.interval_ms:g} ms apart, {len(scopes)} scope(s);"
        " latency: model yield -> this client's receipt)"
    )


if __name__ == "__main__":
    common.run(main())
