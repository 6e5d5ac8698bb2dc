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
    lines = stdout.splitlines()
    ratios = [line for line in lines if "the refetching client's" in line]
    rows = [
        line for line in lines if line.startswith(("embedded", "Postgres")) and line not in ratios
    ]
    assert len(rows) == 4 and len(ratios) == 2, stdout  # each setup refetching, then deltas
    for row in rows:
        deltas = row.split(")", 1)[1].startswith(", deltas")
        # runs, runs/s, CPU ms per run, (by process), first p50, first p99, refetches, deltas
        # applied, 304s, round trips, write system calls
        cells = row.split(")", 1)[1].removeprefix(", deltas").split()
        runs, rate, cpu = int(cells[0]), float(cells[1]), float(cells[2])
        assert runs == 5 and rate > 0 and cpu > 0, stdout
        first_p50, _p99, refetches, applied, _not_modified, trips, writes = (
            float(v) for v in cells[-7:]
        )
        assert first_p50 > 0 and trips >= 4 and writes > 0, stdout
        if deltas:  # the invalidations' deltas replace the refetches
            assert applied >= 1, stdout
        else:
            assert refetches >= 1 and applied == 0, stdout
    assert "postgres" in rows[2] and "postgres" in rows[3], stdout  # the database's backends


def test_watchers_bench_quick() -> None:
    stdout = run_bench("watchers.py")
    rows = [
        line.split()
        for line in stdout.splitlines()
        if line.split()[:1] != [] and line.split()[0].isdigit() and "watchers:" not in line
    ]
    assert [tuple(row[:3]) for row in rows] == [
        ("4", "on", "off"),
        ("4", "on", "on"),
        ("10", "on", "off"),
        ("10", "on", "on"),
        ("4", "off", "off"),
        ("10", "off", "off"),
    ], stdout
    for watchers, cache, deltas, *figures in rows:
        reads = float(figures[0]) + float(figures[1])  # both gateways, per commit
        refetches, applied = float(figures[4]), float(figures[6])
        # Off: one read per watcher per commit. Cached: one per gateway (a read that raced a
        # resync may be made again: at most half a read more per gateway on average).
        if cache == "off":
            assert reads == int(watchers), stdout
        else:
            assert 2 <= reads <= 3, stdout
        # Deltas: every watcher one version behind applies the delta instead of refetching.
        if deltas == "on":
            assert applied == int(watchers) and refetches == 0, stdout
        else:
            assert applied == 0 and refetches == int(watchers), stdout
    assert "convergence p50" in stdout, stdout


def test_live_runs_bench_quick() -> None:
    stdout = run_bench("live_runs.py")
    (row,) = [line.split() for line in stdout.splitlines() if line.split()[:1] == ["20"]]
    assert int(row[1]) == 200, stdout  # every token of every run arrived
    assert float(row[2]) > 0 and float(row[3]) >= float(row[2]), stdout
