"""Each benchmark's `--quick` run completes against real processes and prints its tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.harness import ROOT
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def run_bench(script: str, timeout: float = 150) -> str:
    """Run `bench/<script> --quick` on the suite's Postgres and Redis; its stdout, once it
    exited 0. A session of its own: on a timeout the bench and the servers it started die
    together."""
    servers = ["--postgres", require_postgres(), "--redis", require_redis()]
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *servers],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=timeout)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.communicate(timeout=10)
    assert bench.returncode == 0, f"{stdout}\n{stderr[-4000:]}"
    return stdout


def test_fanout_bench_quick() -> None:
    stdout = run_bench("fanout.py")
    lines = stdout.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split()[:2] == ["subscribers", "messages"]
    )
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [row[0] for row in rows] == ["1", "20"], stdout
    assert all(float(value) >= 0 for row in rows for value in row[2:9]), stdout
    # The side-by-side part: both servers measured, a ratio row, figures that are numbers.
    compared = [
        line
        for line in lines
        if line.startswith(
            ("websockets + Redis reference", "Threadline gateway", "ratio Threadline / reference")
        )
    ]
    assert len(compared) == 6, stdout
    assert float(compared[1].split()[3]) > 0, stdout  # Threadline's CPU µs per delivery
    idle = lines.index(next(line for line in lines if "per connection KiB" in line))
    assert lines[idle + 1].split()[0] == "200", stdout
    assert float(lines[idle + 1].split()[-1]) > 0, stdout


def test_presence_bench_quick() -> None:
    stdout = run_bench("presence.py")
    rows = {line.split()[0]: line.split() for line in stdout.splitlines() if line.strip()}
    assert float(rows["chunks"][2]) > 0 and float(rows["presence"][2]) > 0, stdout
    assert "40 saw everyone, closed by the server: none" in stdout, stdout  # joins converged


def test_runtime_bench_quick() -> None:
    stdout = run_bench("runtime_bench.py")
    rows = {line.split()[0]: line.split() for line in stdout.splitlines() if line.strip()}
    for setup in ("sqlite+memory", "postgres+redis"):
        # chunk p50 µs, chunk p99 µs, runs/s, CPU ms per run
        assert all(float(value) > 0 for value in rows[setup][1:5]), stdout
    # Thread-length scaling: CPU and wall ms per run for both setups, per length.
    for length in ("10", "200", "2000"):
        assert len(rows[length]) == 5 and all(float(v) > 0 for v in rows[length][1:]), stdout
    # The worker in a process of its own, on each event loop: worker, admission, run, client
    # ms, runs/s per row, and the ratio of the worker's CPU on the two loops.
    split = [
        line.split()
        for line in stdout.splitlines()
        if "messages " in line and line.endswith(" runs)")
    ]
    assert [row[:2] for row in split] == [
        ["uvloop:", "sequential,"],
        ["uvloop:", "8"],
        ["asyncio:", "sequential,"],
        ["asyncio:", "8"],
    ], stdout
    (ratio,) = [line for line in stdout.splitlines() if line.startswith("worker CPU per run,")]
    assert all(float(r.rstrip("x,")) > 0 for r in ratio.split(":")[1].split()), stdout
    for row in split:
        figures = [float(v) for v in row[row.index("messages") + 1 :][:5]]
        worker, admission, run, _client, rate = figures
        assert worker > 0 and admission > 0 and rate > 0, stdout
        assert abs(run - (worker + admission)) < 0.02, stdout


def test_instructions_bench_quick() -> None:
    stdout = run_bench("instructions.py", timeout=450)  # a worker under valgrind: ~50x slower
    lines = stdout.splitlines()
    assert lines[1].split()[1:] == ["uvloop"], stdout
    # This tree's row: instructions per run, in millions.
    assert float(lines[2].split()[-1]) > 0, stdout


def test_api_bench_quick() -> None:
    stdout = run_bench("api.py")
    rows = [line for line in stdout.splitlines() if line.startswith(("embedded", "Postgres"))]
    assert len(rows) == 2, stdout
    for row in rows:
        # runs, runs/s, CPU ms per run, ..., first p50, first p99, refetches, 304s, round trips,
        # write system calls
        cells = row.split(")", 1)[1].split()
        runs, rate, cpu = int(cells[0]), float(cells[1]), float(cells[2])
        assert runs == 5 and rate > 0 and cpu > 0, stdout
        first_p50, _p99, refetches, _not_modified, trips, writes = (float(v) for v in cells[-6:])
        assert first_p50 > 0 and refetches >= 1 and trips >= 5 and writes > 0, stdout
    assert "postgres" in rows[1], stdout  # the database's backends are counted


def test_watchers_bench_quick() -> None:
    stdout = run_bench("watchers.py")
    rows = [line.split() for line in stdout.splitlines() if line.split()[1:2] in (["on"], ["off"])]
    assert [(row[0], row[1]) for row in rows] == [
        ("4", "on"),
        ("10", "on"),
        ("4", "off"),
        ("10", "off"),
    ], stdout
    for watchers, cache, *figures in rows:
        reads = float(figures[0]) + float(figures[1])  # both gateways, per commit
        # Off: one read per watcher per commit. Cached: one per gateway (a read that raced a
        # resync may be made again: at most half a read more per gateway on average).
        if cache == "off":
            assert reads == int(watchers), stdout
        else:
            assert 2 <= reads <= 3, stdout


def test_live_runs_bench_quick() -> None:
    stdout = run_bench("live_runs.py")
    (row,) = [line.split() for line in stdout.splitlines() if line.split()[:1] == ["20"]]
    assert int(row[1]) == 200, stdout  # every token of every run arrived
    assert float(row[2]) > 0 and float(row[3]) >= float(row[2]), stdout
