"""Instructions per demo run of the served worker (`threadline serve --role worker`) under
callgrind, on Postgres + Redis: a figure that does not move with the box's load, unlike CPU
time on a shared 2-core machine. Prints its figures; asserts nothing.

    python bench/instructions.py --postgres ADMIN_DSN --redis URL [--runs 20] [--length 200]
                                 [--loops uvloop,asyncio] [--tree PATH ...] [--quick]

For each source tree (this checkout by default; `--tree` adds others, e.g. a `git worktree`
of an earlier commit, measured side by side in the same run, their ratio to the first
printed) and each event loop of --loops, a worker of that tree runs under
`valgrind --tool=callgrind` on a database of its own. This process admits one demo run at a
time on a thread of --length messages (`ThreadService.send_message`, this checkout's code) and
polls the run until it ends. The counters are zeroed after two warm-up runs
(`callgrind_control --zero`) and dumped after --runs runs: the count covers exactly the
worker's share of those runs (its wakeups, lease, episode, commits, publishes, and whatever
else it ran meanwhile, e.g. a heartbeat), user-space instructions only (system calls count
as the instructions that make them, not the kernel's). Polling is every 30 s and a lease
lasts 120 s, so idle work stays out of the count. A tree older than THREADLINE_EVENT_LOOP
runs on uvicorn's automatic choice whatever --loops says. A tree older than wakeups naming
their run's thread (`WakeupEnvelope.thread_id`) drops this checkout's wakeups as malformed and
takes each run only at its 30 s poll: measure such a tree from its own checkout instead
(`cd TREE && python bench/instructions.py …`; the counts of two runs compare like those of
one). --quick: 2 runs, uvloop only (the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["THREADLINE_DEMO_DELAY_MS"] = "0"

import common  # bench/common.py, next to this script
import runtime_bench  # bench/runtime_bench.py, next to this script

from realtime import open_bus
from runtime.demo import demo_agent
from runtime.domain import Principal, Role
from runtime.engine.publisher import Publisher
from runtime.service.thread_service import ThreadService
from runtime.storage import open_store
from runtime.storage.store import Store
from tests.e2e import harness

PRINCIPAL = Principal(subject="bench", role=Role.USER, scopes=frozenset({"bench"}))
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 600.0  # python's imports run ~50x slower under valgrind
RUN_TIMEOUT = 120.0


def total_instructions(dump: Path) -> int:
    """The `totals:` (or `summary:`) line of a callgrind dump: Ir, the first event."""
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


@dataclass
class Traced:
    """A worker under callgrind, writing its dumps to `out_dir`."""

    process: subprocess.Popen[bytes]
    out_dir: Path
    log: IO[bytes]

    @classmethod
    def start(cls, tree: Path, env: dict[str, str], out_dir: Path) -> Traced:
        port = harness.free_port()
        log = (out_dir / "worker.log").open("wb")
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=no",
                f"--callgrind-out-file={out_dir}/callgrind.out.%p",
                sys.executable,
                "-m",
                "server.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--role",
                "worker",
            ],
            cwd=tree,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        traced = cls(process, out_dir, log)
        try:
            harness.wait_healthy(f"http://127.0.0.1:{port}", process, START_TIMEOUT)
        except BaseException:
            traced.stop()
            raise
        return traced

    def control(self, option: str) -> None:
        subprocess.run(
            ["callgrind_control", option, str(self.process.pid)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def dump(self) -> int:
        """Dump the counters now: the instructions since the last zeroing."""
        before = set(self.out_dir.glob("callgrind.out.*"))
        self.control("--dump")
        dumps = sorted(set(self.out_dir.glob("callgrind.out.*")) - before)
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        return total_instructions(dumps[-1])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


async def run_once(service: ThreadService, store: Store, thread_id: str, n: int) -> None:
    admission = await service.send_message(PRINCIPAL, thread_id, f"hello number {n}")
    assert admission.run_id is not None
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        if (await store.get_run(admission.run_id)).status.is_terminal:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"run {admission.run_id} did not end in {RUN_TIMEOUT}s")


async def measure(
    tree: Path, loop: str, admin_dsn: str, redis_url: str, runs: int, length: int
) -> float:
    """Worker instructions per run for one tree and event loop."""
    async with common.own_database(admin_dsn) as database_url:
        out_dir = Path(tempfile.mkdtemp(prefix="threadline-callgrind-"))
        try:
            async with open_store(database_url) as store, open_bus(redis_url) as bus:
                service = ThreadService(store, Publisher(bus), demo_agent())
                thread_id = (await service.create_thread(PRINCIPAL, title="ir")).thread.id
                await runtime_bench.prefill(store, thread_id, length)
                env = harness.server_env(
                    database_url,
                    {
                        "THREADLINE_REDIS_URL": redis_url,
                        "THREADLINE_EVENT_LOOP": loop,
                        "THREADLINE_POLL_INTERVAL": "30",
                        "THREADLINE_LEASE_TTL": "120",
                    },
                )
                traced = await asyncio.to_thread(Traced.start, tree, env, out_dir)
                try:
                    for n in range(2):  # warm-up: first statements, caches
                        await run_once(service, store, thread_id, n)
                    await asyncio.sleep(1.0)  # the last run's release and publishes
                    await asyncio.to_thread(traced.control, "--zero")
                    for n in range(runs):
                        await run_once(service, store, thread_id, 2 + n)
                    await asyncio.sleep(1.0)
                    return await asyncio.to_thread(traced.dump) / runs
                finally:
                    await asyncio.to_thread(traced.stop)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", required=True, help="admin DSN (databases are made)")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--runs", type=int, default=20, help="measured runs per worker")
    parser.add_argument("--length", type=int, default=200, help="messages before the runs")
    parser.add_argument("--loops", default="uvloop,asyncio", help="event loops of the worker")
    parser.add_argument("--tree", action="append", default=[], help="another source tree")
    parser.add_argument("--quick", action="store_true", help="2 runs on uvloop, for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.loops = 2, "uvloop"
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    args.trees = [ROOT, *(Path(t).resolve() for t in args.tree)]
    return args


async def main(args: argparse.Namespace) -> None:
    trees: list[Path] = args.trees
    loops = [name for name in args.loops.split(",") if name]
    results: dict[tuple[Path, str], float] = {}
    for loop in loops:
        for tree in trees:
            results[tree, loop] = await measure(
                tree, loop, args.postgres, args.redis, args.runs, args.length
            )
    print(
        f"served worker, instructions per demo run (M), {args.runs} runs on a"
        f" {args.length}-message thread, Postgres + Redis"
    )
    print(f"{'tree':40} " + " ".join(f"{loop:>10}" for loop in loops))
    for tree in trees:
        label = _label(tree)
        cells = []
        for loop in loops:
            value = results[tree, loop] / 1e6
            ratio = results[tree, loop] / results[trees[0], loop]
            cells.append(f"{value:10.2f}" + ("" if tree == ROOT else f" ({ratio:.2f}x)"))
        print(f"{label:40} " + " ".join(cells))
    if len(loops) == 2:
        first, second = loops
        print(
            f"{first} / {second} for this tree: {results[ROOT, first] / results[ROOT, second]:.2f}x"
        )


def _label(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    text = done.stdout.strip() or str(tree)
    return re.sub(r"\s+", " ", text)[:40]


if __name__ == "__main__":
    common.run(main(parse_args()))
