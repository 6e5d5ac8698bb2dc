"""API-path benchmark: a scripted agent's run (a tool call, then 15 streamed tokens) driven
through the public API of real `threadline serve` processes, the way a careful client does it.
Prints server CPU per run, runs/s, first-token latency and refetches and round trips per run;
asserts nothing.

    python bench/api.py [--runs 60] [--setups embedded,scale-out] [--deltas off,on]
                        [--postgres ADMIN_DSN] [--redis URL] [--profile-dir DIR [--native]]
                        [--instructions] [--quick]

Per run, one after another, one client (httpx over HTTP/1.1 keep-alive, one `websockets`
connection held for the whole bench):

1. `POST /v1/threads` (the answer is the new thread's snapshot);
2. `subscribe` on the websocket, until `subscribed`;
3. `POST /v1/threads/{id}/messages`;
4. on every `invalidate` newer than the snapshot it holds, `GET /v1/threads/{id}` (a refetch;
   with `If-None-Match` of the snapshot it holds, so an unchanged one answers 304), until the
   snapshot shows the run ended; the first `text-delta` chunk is the first token. The websocket
   is read while a refetch is under way, as a UI reads it (until 2026-12-02 it was read only
   between refetches: a run that ended during one had its chunks read after it, so on a loaded
   box most runs had no first token and the figure came from the rest);
5. `unsubscribe`, until `unsubscribed`.

Setups: `embedded` is one `threadline serve` (SQLite file, in-process bus, worker inside);
`scale-out` is a gateway and a worker process (`--role gateway`, `--role worker`) on Postgres +
Redis (throwaway servers of the run's own unless given). Server CPU is read from /proc (psutil)
for the served processes and, on Postgres, for every backend of the bench's database
(`pg_stat_activity`) before and after the measured runs; round trips are the client's HTTP
requests and websocket frames sent per run. First token: from sending step 3 to receiving the
first text-delta. --profile-dir DIR runs each server under `py-spy record` (when installed) and
writes collapsed stacks per process there (`flamegraph.pl` or speedscope read them); with
--native they include C frames (uvloop, the kernel's calls). --instructions runs the embedded
server under `valgrind --tool=callgrind` instead, and prints its user-space instructions per run
(counters zeroed after the warm-up, dumped after the last run): a count that does not move with
the box's load (system calls count as the instructions that make them, not the kernel's work).

Aegra (the LangGraph Platform API), the reference of issue 35, is measured beside these two in
the same run by bench/aegra.py (`aegra-api` 0.6.0 in a virtualenv of its own, on the same
Postgres server), which imports this module's setups and its CPU helpers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psutil
from websockets.asyncio.client import ClientConnection, connect

from threadline_wire.snapshot_delta import DeltaMismatch, apply

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # bench/common.py, next to this script

from tests.e2e import harness

BENCH_DIR = Path(__file__).resolve().parent
TERMINAL = {"completed", "failed", "cancelled"}


def agent_env(agent: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Settings that serve bench/scripted_agent.py's `agent` without the per-token caps."""
    return {
        "THREADLINE_AGENT": f"scripted_agent:{agent}",
        "PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(harness.ROOT)]),
        "THREADLINE_TOKEN_RATE": "1000000",
        "THREADLINE_TOKEN_BURST": "1000000",
        "THREADLINE_SCOPE_RATE": "1000000",
        "THREADLINE_SCOPE_BURST": "1000000",
        "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1000000",
        "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": "1000000",
        **(extra or {}),
    }


@dataclass
class Tally:
    runs: int = 0
    requests: int = 0  # HTTP requests
    frames: int = 0  # websocket frames sent
    refetches: int = 0  # snapshot reads after an invalidation
    not_modified: int = 0  # of them answered 304
    applied: int = 0  # invalidations whose delta was applied instead of a refetch
    first_token: list[float] | None = None

    def __post_init__(self) -> None:
        self.first_token = []


@dataclass
class Watch:
    """One run as the client sees it: when its message was sent, its first token, the
    invalidations not yet acted on."""

    sent: float
    first: float = float("nan")
    first_seen: asyncio.Event = field(default_factory=asyncio.Event)
    invalidations: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class Client:
    """The careful client of the module docstring: one HTTP client, one websocket; with
    `deltas` it subscribes with `"deltas": true` and applies an invalidation's delta that starts
    at the snapshot it holds instead of refetching (as the Python and TypeScript clients do)."""

    def __init__(
        self, http: httpx.AsyncClient, ws: ClientConnection, tally: Tally, deltas: bool
    ) -> None:
        self.http = http
        self.ws = ws
        self.tally = tally
        self.deltas = deltas

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        self.tally.requests += 1
        response = await self.http.request(method, path, **kw)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response

    async def send(self, frame: dict[str, Any]) -> None:
        self.tally.frames += 1
        await self.ws.send(orjson.dumps(frame).decode())

    async def until(self, kind: str) -> dict[str, Any]:
        while True:
            frame: dict[str, Any] = orjson.loads(await self.ws.recv())
            if frame["type"] == kind:
                return frame
            if frame["type"] == "error":
                raise RuntimeError(f"error frame: {frame}")

    async def run_once(self, n: int) -> None:
        snapshot = (await self.request("POST", "/v1/threads", json={"title": f"api {n}"})).json()
        thread_id = snapshot["thread"]["id"]
        await self.send({"type": "subscribe", "thread_id": thread_id, "deltas": self.deltas})
        await self.until("subscribed")
        watch = Watch(time.perf_counter())
        admission = await self.request(
            "POST", f"/v1/threads/{thread_id}/messages", json={"text": f"look it up {n}"}
        )
        reader = asyncio.create_task(self.read(watch))
        try:
            async with asyncio.timeout(60):
                run_id = admission.json()["run_id"]
                await self.refetch_until_ended(thread_id, run_id, snapshot, watch)
            # Its chunks came before the run's last commit: they are read by now, or nearly.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await watch.first_seen.wait()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await self.send({"type": "unsubscribe", "thread_id": thread_id})
        await self.until("unsubscribed")
        assert self.tally.first_token is not None
        self.tally.first_token.append(watch.first)
        self.tally.runs += 1

    async def read(self, watch: Watch) -> None:
        """The websocket, read while refetches are under way (as a UI reads it): the first
        text-delta is timed when it arrives, invalidations are queued for the refetches."""
        while True:
            frame = orjson.loads(await self.ws.recv())
            kind = frame["type"]
            if kind == "chunk" and not watch.first_seen.is_set():
                if frame["chunk"]["type"] == "text-delta":
                    watch.first = time.perf_counter() - watch.sent
                    watch.first_seen.set()
            elif kind in ("invalidate", "resync"):
                watch.invalidations.put_nowait(frame)

    async def refetch_until_ended(
        self, thread_id: str, run_id: str, snapshot: dict[str, Any], watch: Watch
    ) -> None:
        """Each invalidation newer than the snapshot held, in order: its delta applied when
        it starts at the held version, else a refetch, until the snapshot shows the run ended."""
        held, etag = snapshot["thread"]["version"], None
        while True:
            frame = await watch.invalidations.get()
            if frame.get("version", held + 1) <= held:
                continue
            delta = frame.get("delta")
            if isinstance(delta, dict) and delta.get("from") == held:
                try:
                    snapshot = apply(snapshot, {k: v for k, v in delta.items() if k != "etag"})
                except DeltaMismatch:
                    pass
                else:
                    self.tally.applied += 1
                    held, etag = snapshot["thread"]["version"], delta.get("etag")
                    if ended(snapshot, run_id):
                        return
                    continue
            headers: dict[str, str] = {"If-None-Match": etag} if etag else {}
            self.tally.refetches += 1
            got = await self.request("GET", f"/v1/threads/{thread_id}", headers=headers)
            if got.status_code == 304:
                self.tally.not_modified += 1
                continue
            snapshot, etag = got.json(), got.headers.get("etag")
            held = snapshot["thread"]["version"]
            if ended(snapshot, run_id):
                return


def ended(snapshot: dict[str, Any], run_id: str) -> bool:
    run = snapshot.get("run") or {}
    return run.get("id") == run_id and run.get("status") in TERMINAL


@contextlib.asynccontextmanager
async def client(url: str, token: str, tally: Tally, deltas: bool = False) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    ws_url = url.replace("http://", "ws://") + "/v1/ws"
    async with (
        httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http,
        connect(ws_url, subprotocols=["threadline.v1", f"bearer.{token}"]) as ws,  # type: ignore[list-item]
    ):
        yield Client(http, ws, tally, deltas)


def cpu_of(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[pid] = float(times.user + times.system)
    return out


async def backend_pids(dsn: str | None) -> list[int]:
    """The Postgres backends serving the bench's database (its pools), by pg_stat_activity."""
    if dsn is None:
        return []
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
    finally:
        await connection.close()
    return [int(row["pid"]) for row in rows]


def writes_of(pids: list[int]) -> int:
    """The write-type system calls (`write`, `send`, `pwrite`: /proc's `syscw`) made so far."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).io_counters().write_count
    return total


@dataclass
class Row:
    setup: str
    runs: int
    wall: float
    cpu_ms: dict[str, float]  # per run, by process kind
    writes: float  # the served processes' write system calls per run
    tally: Tally
    instructions: float | None = None  # per run, under callgrind (--instructions)

    @property
    def total_ms(self) -> float:
        return sum(self.cpu_ms.values())


async def measure(
    setup: str,
    url: str,
    token: str,
    processes: dict[str, int],
    dsn: str | None,
    runs: int,
    traced: Path | None = None,
    deltas: bool = False,
) -> Row:
    """The runs, measured; with `traced` (callgrind's output directory) the one served process
    runs under callgrind and its instructions are counted too."""
    tally = Tally()
    instructions = None
    if deltas:
        setup += ", deltas"
    async with client(url, token, tally, deltas) as api:
        for n in range(min(10, runs)):  # warm-up: imports, pools, caches
            await api.run_once(n)
        tally.__init__()  # type: ignore[misc]
        if traced is not None:
            (pid,) = processes.values()  # the embedded server only
            callgrind_control("--zero", pid)
        backends = await backend_pids(dsn)
        before = {kind: cpu_of([pid]) for kind, pid in processes.items()}
        before_pg = cpu_of(backends)
        writes_before = writes_of(list(processes.values()))
        started = time.perf_counter()
        for n in range(runs):
            await api.run_once(n)
        wall = time.perf_counter() - started
        after = {kind: cpu_of([pid]) for kind, pid in processes.items()}
        writes = (writes_of(list(processes.values())) - writes_before) / runs
        if traced is not None:
            instructions = callgrind_dump(traced, pid) / runs
        after_pg = cpu_of(await backend_pids(dsn))
    cpu = {
        kind: (sum(after[kind].values()) - sum(before[kind].values())) / runs * 1e3
        for kind in processes
    }
    if dsn is not None:
        used = sum(t - before_pg.get(pid, 0.0) for pid, t in after_pg.items())
        cpu["postgres"] = used / runs * 1e3
    return Row(setup, runs, wall, cpu, writes, tally, instructions)


PY_SPY_FLAGS: list[str] = []  # ["--native"] with --native


def callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def callgrind_dump(directory: Path, pid: int) -> int:
    """Dump the counters of `pid` now: its instructions (Ir) since they were zeroed."""
    before = set(directory.glob("callgrind.out.*"))
    callgrind_control("--dump", pid)
    for dump in sorted(set(directory.glob("callgrind.out.*")) - before):
        for line in dump.read_text().splitlines():
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no dump with totals")


@contextlib.contextmanager
def under_callgrind(directory: Path | None) -> Iterator[None]:
    """Servers started in the block run under callgrind, its dumps in `directory` (None: not)."""
    if directory is None:
        yield
        return
    command = harness.COMMAND
    harness.COMMAND = [
        "valgrind",
        "--tool=callgrind",
        "--dump-instr=no",
        f"--callgrind-out-file={directory}/callgrind.out.%p",
        *command,
    ]
    try:
        yield
    finally:
        harness.COMMAND = command


@contextlib.contextmanager
def profiled(handles: list[harness.ServerHandle], directory: Path | None) -> Iterator[None]:
    """py-spy on every served process while the block runs (nothing without a directory)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if directory is None or not Path(spy).exists():
        if directory is not None:
            print("py-spy is not installed: no profile", file=sys.stderr)
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(h.process.pid),
                "--rate",
                "500",
                "--format",
                "raw",
                "--output",
                str(directory / f"{h.role}-{h.port}.folded"),
                *PY_SPY_FLAGS,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for h in handles
    ]
    try:
        yield
    finally:
        for process in spies:
            process.send_signal(2)  # SIGINT: py-spy writes its profile and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)


async def embedded(
    runs: int, profile: Path | None, instructions: bool = False, deltas: bool = False
) -> Row:
    directory = Path(tempfile.mkdtemp(prefix="threadline-bench-"))
    env = harness.server_env(harness.sqlite_url(directory), agent_env("api_agent"))
    traced = directory if instructions else None
    with under_callgrind(traced):
        server = harness.start(
            "all", env, log_dir=directory, timeout=600 if traced else harness.START_TIMEOUT
        )
    with server:
        token = server.token("bench")
        with profiled([server], profile):
            return await measure(
                "embedded (SQLite, one process)",
                server.url,
                token,
                {"server": server.process.pid},
                None,
                runs,
                traced,
                deltas,
            )


async def scale_out(
    runs: int, postgres: str, redis: str, profile: Path | None, deltas: bool = False
) -> Row:
    async with common.own_database(postgres) as dsn:
        with common.deployment(dsn, redis, ["gateway", "worker"], agent_env("api_agent")) as (
            gateway,
            worker,
        ):
            token = gateway.token("bench")
            with profiled([gateway, worker], profile):
                return await measure(
                    "Postgres + Redis (gateway + worker)",
                    gateway.url,
                    token,
                    {"gateway": gateway.process.pid, "worker": worker.process.pid},
                    dsn,
                    runs,
                    deltas=deltas,
                )


def report(rows: list[Row]) -> None:
    print(
        f"{'setup':38} {'runs':>5} {'runs/s':>7} {'CPU ms/run':>11} {'(by process)':32}"
        f" {'first p50 ms':>12} {'first p99 ms':>12} {'refetch/run':>11} {'delta/run':>9}"
        f" {'304/run':>8}"
        f" {'trips/run':>9} {'writes/run':>10}"
    )
    for row in rows:
        tally = row.tally
        first = [v * 1e3 for v in tally.first_token or [] if v == v] or [float("nan")]
        parts = " + ".join(f"{k} {v:.2f}" for k, v in row.cpu_ms.items())
        print(
            f"{row.setup:38} {row.runs:5d} {row.runs / row.wall:7.1f} {row.total_ms:11.2f}"
            f" {parts:32} {common.pct(first, 0.5):12.2f} {common.pct(first, 0.99):12.2f}"
            f" {tally.refetches / row.runs:11.2f} {tally.applied / row.runs:9.2f}"
            f" {tally.not_modified / row.runs:8.2f}"
            f" {(tally.requests + tally.frames) / row.runs:9.2f} {row.writes:10.1f}"
        )
        if row.instructions is not None:
            print(f"  under callgrind: {row.instructions / 1e6:.2f} M instructions per run")
    print(
        "CPU: the served processes (and the database's backends) from /proc, per run;"
        " trips: the client's HTTP requests + websocket frames sent; writes: the served"
        " processes' write system calls (sockets, files), per run"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--setups", default="embedded,scale-out")
    parser.add_argument("--postgres", help="admin DSN (a database is made)")
    parser.add_argument("--redis")
    parser.add_argument("--profile-dir", type=Path)
    parser.add_argument("--native", action="store_true", help="profiles with C frames")
    parser.add_argument(
        "--instructions", action="store_true", help="embedded only, under callgrind"
    )
    parser.add_argument(
        "--deltas",
        default="off,on",
        help="off: refetch on every newer invalidation; on: subscribe with deltas (both: off,on)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5 runs each")
    args = parser.parse_args()
    if args.quick:
        args.runs = 5
    if args.native:
        PY_SPY_FLAGS.append("--native")
    setups = [s for s in args.setups.split(",") if s]
    modes = [{"off": False, "on": True}[m] for m in args.deltas.split(",") if m]
    rows = []
    if "embedded" in setups:
        for deltas in modes:
            rows.append(await embedded(args.runs, args.profile_dir, args.instructions, deltas))
    if "scale-out" in setups:
        with common.servers(args.postgres, args.redis) as (postgres, redis):
            for deltas in modes:
                row = await scale_out(args.runs, postgres, redis, args.profile_dir, deltas)
                rows.append(row)
    report(rows)
    off = {r.setup: r for r in rows if not r.setup.endswith(", deltas")}
    for row in rows:
        if row.setup.endswith(", deltas") and row.setup.removesuffix(", deltas") in off:
            base = off[row.setup.removesuffix(", deltas")]
            print(
                f"{row.setup}: CPU per run {row.total_ms / base.total_ms:.2f}x and runs/s"
                f" {(row.runs / row.wall) / (base.runs / base.wall):.2f}x the refetching client's"
            )


if __name__ == "__main__":
    common.run(main())
