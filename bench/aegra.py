"""Aegra beside Threadline in the same run: bench/api.py's scripted run (a tool call, then 15
streamed tokens) through Threadline's public API, embedded and on Postgres + Redis, and its
LangGraph twin through Aegra 0.6's (the LangGraph Platform API) on the same Postgres server, a
database each. Prints runs/s, server CPU per run (+ Postgres backends), first token p50 / p99
and the ratios Threadline / Aegra per round; asserts nothing.

    python bench/aegra.py [--runs 60] [--rounds 1] [--setups embedded,scale-out,aegra]
                          [--postgres ADMIN_DSN] [--redis URL] [--aegra-venv DIR]
                          [--stream-mode messages-tuple[,values]] [--quick]

Aegra runs in a virtualenv of its own, so its dependencies never touch the project's:
`build/aegra-venv`, made on first use with `python3.11 -m venv` and
`pip install aegra-api==0.6.0 uvloop` (uvloop: Threadline's server runs on it too; both serve
HTTP with uvicorn's h11). The server is `uvicorn aegra_api.main:app` (one process, as its README
starts it) in bench/aegra_side/ (its `aegra.json` names the graph), with `DATABASE_URL`,
`AUTH_TYPE=noop` and `LOG_LEVEL=WARNING` (Threadline's benches log at warning too). The graph
(bench/aegra_side/graph.py) is a ReAct loop around a scripted chat model that streams what
bench/scripted_agent.py's does; the client (bench/aegra_side/driver.py, the official
`langgraph-sdk` in that virtualenv) creates a thread and streams a run to its end, per run,
sequentially. Those two files import packages the project's virtualenv lacks, so mypy skips
bench/aegra_side/ (pyproject); ruff checks them.

CPU is measured as bench/api.py measures Threadline's (its helpers): the server process (and
any children) and every backend of the setup's database, from /proc, before and after the
measured runs, after 10 warm-up runs. First token: from starting the request that starts the
run (Threadline: the message POST; Aegra: the streamed run POST) to the first text token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api  # bench/api.py, next to this script
import common

from tests.e2e import harness

ROOT = Path(__file__).resolve().parent.parent
SIDE = Path(__file__).resolve().parent / "aegra_side"
DEFAULT_VENV = ROOT / "build" / "aegra-venv"
AEGRA = "aegra-api==0.6.0"
WARMUP = 10
TRACING = ("LANGSMITH_", "LANGCHAIN_", "LANGGRAPH_")  # no tracing, no API key from the caller


def ensure_venv(venv: Path) -> Path:
    """The virtualenv's python, with Aegra installed in it first if it is not yet."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import aegra_api, greenlet, langgraph_sdk, uvloop"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing {AEGRA} into {venv} (once)", file=sys.stderr)
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    # greenlet: SQLAlchemy's asyncio needs it and aegra-api 0.6 does not require it.
    install = [str(python), "-m", "pip", "install", "-q", AEGRA, "greenlet", "uvloop"]
    subprocess.run(install, check=True)
    return python


@contextlib.contextmanager
def aegra_server(python: Path, dsn: str) -> Iterator[tuple[str, int]]:
    """`uvicorn aegra_api.main:app` on a free loopback port, once it answers /health; stopped
    on the way out, whatever happened."""
    port = harness.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", *TRACING))}
    env.update(
        {
            "DATABASE_URL": dsn,
            "AUTH_TYPE": "noop",
            "AEGRA_CONFIG": "aegra.json",
            "LOG_LEVEL": "WARNING",
            "ENV_MODE": "PRODUCTION",
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [str(python), "-m", "uvicorn", "aegra_api.main:app", "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as directory:
        log = Path(directory) / "aegra.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*command, "--host", "127.0.0.1", "--port", str(port)],
                cwd=SIDE,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + harness.START_TIMEOUT
            while not _healthy(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Aegra did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield url, process.pid
        finally:
            process.terminate()
            try:
                process.wait(timeout=harness.STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    return False


def family(pid: int) -> list[int]:
    """A process and its children (uvicorn serves in one process; this is a guard)."""
    with contextlib.suppress(psutil.Error):
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    return [pid]


async def line_of(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    line = await process.stdout.readline()
    if not line:
        await process.wait()
        raise RuntimeError(f"the Aegra driver exited ({process.returncode})")
    return line.decode().strip()


async def say(driver: asyncio.subprocess.Process, line: str) -> None:
    assert driver.stdin is not None
    driver.stdin.write(f"{line}\n".encode())
    await driver.stdin.drain()


async def drive(
    driver: asyncio.subprocess.Process, pid: int, dsn: str, runs: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """The driver's measured runs, the server's and the backends' CPU read around them."""
    if await line_of(driver) != "ready":
        raise RuntimeError("the Aegra driver did not get ready")
    before, before_pg = api.cpu_of(family(pid)), api.cpu_of(await api.backend_pids(dsn))
    await say(driver, "go")
    result: dict[str, Any] = json.loads(await line_of(driver))
    after, after_pg = api.cpu_of(family(pid)), api.cpu_of(await api.backend_pids(dsn))
    await say(driver, "verify")
    print(await line_of(driver), file=sys.stderr)
    if await driver.wait() != 0:
        raise RuntimeError(f"the Aegra driver failed ({driver.returncode})")
    server = sum(t - before.get(p, 0.0) for p, t in after.items())
    used_pg = sum(t - before_pg.get(p, 0.0) for p, t in after_pg.items())
    return result, {"server": server / runs * 1e3, "postgres": used_pg / runs * 1e3}


async def aegra(runs: int, postgres: str, python: Path, stream_mode: str) -> api.Row:
    async with common.own_database(postgres) as dsn:
        with aegra_server(python, dsn) as (url, pid):
            driver = await asyncio.create_subprocess_exec(
                str(python),
                str(SIDE / "driver.py"),
                *("--url", url, "--runs", str(runs), "--warmup", str(min(WARMUP, runs))),
                *("--stream-mode", stream_mode),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if not k.startswith(TRACING)},
            )
            try:
                writes_before = api.writes_of([pid])
                async with asyncio.timeout(60 + 5 * runs):  # a hang guard
                    result, cpu = await drive(driver, pid, dsn, runs)
                # Warm-up runs included: an upper bound of the measured runs' writes.
                writes = (api.writes_of([pid]) - writes_before) / runs
            finally:
                if driver.returncode is None:
                    driver.kill()
                    await driver.wait()
    if result["odd_streams"]:
        print(
            f"Aegra: {result['odd_streams']} of {runs} runs streamed another number of tokens"
            " than the model's 15 (its replay of stored events, then the same events live)"
        )
    tally = api.Tally(runs=runs, requests=int(result["requests"]))
    tally.first_token = [float(v) for v in result["first_token"]]
    setup = "Aegra 0.6 (Postgres, one process)"
    return api.Row(setup, runs, float(result["wall"]), cpu, writes, tally)


def ratios(rows: list[api.Row]) -> None:
    """Threadline / Aegra for each Threadline row of a round."""
    theirs = next((r for r in rows if r.setup.startswith("Aegra")), None)
    if theirs is None:
        return
    t_first = common.pct([v for v in theirs.tally.first_token or [] if v == v], 0.5)
    print(
        f"{'Threadline / Aegra':38} {'runs/s':>7} {'CPU/run':>8} {'server CPU/run':>15}"
        f" {'Postgres CPU/run':>17} {'first p50':>10}"
    )
    for row in rows:
        if row is theirs:
            continue
        first = common.pct([v for v in row.tally.first_token or [] if v == v], 0.5)
        server = row.total_ms - row.cpu_ms.get("postgres", 0.0)
        t_server = theirs.total_ms - theirs.cpu_ms["postgres"]
        pg = "-"
        if "postgres" in row.cpu_ms:
            pg = f"{row.cpu_ms['postgres'] / theirs.cpu_ms['postgres']:.2f}x"
        print(
            f"{row.setup:38} {theirs.wall / row.wall * row.runs / theirs.runs:6.2f}x"
            f" {row.total_ms / theirs.total_ms:7.2f}x {server / t_server:14.2f}x {pg:>17}"
            f" {first / t_first:9.2f}x"
        )
    print("runs/s: higher is better (goal: Postgres + Redis >= 10x); CPU and first token: lower")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--setups", default="embedded,scale-out,aegra")
    parser.add_argument("--postgres", help="admin DSN (a database is made per setup)")
    parser.add_argument("--redis")
    parser.add_argument("--aegra-venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument(
        "--stream-mode", default="messages-tuple", help="Aegra's, comma-separated (SDK names)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5 runs each")
    args = parser.parse_args()
    if args.quick:
        args.runs = 5
    setups = [s for s in args.setups.split(",") if s]
    if unknown := set(setups) - {"embedded", "scale-out", "aegra"}:
        parser.error(f"unknown setups: {', '.join(sorted(unknown))}")
    python = ensure_venv(args.aegra_venv) if "aegra" in setups else None
    with common.servers(args.postgres, args.redis) as (postgres, redis):
        for round_ in range(args.rounds):
            load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
            print(f"round {round_ + 1} of {args.rounds}, load average {load}")
            measured = {}
            # Every other round in the reverse order, so no setup always runs first or last.
            for setup in setups if round_ % 2 == 0 else setups[::-1]:
                if setup == "embedded":
                    measured[setup] = await api.embedded(args.runs, None)
                elif setup == "scale-out":
                    measured[setup] = await api.scale_out(args.runs, postgres, redis, None)
                elif python is not None:
                    measured[setup] = await aegra(args.runs, postgres, python, args.stream_mode)
            rows = [measured[setup] for setup in setups]
            api.report(rows)
            ratios(rows)
            load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
            print(f"load average after the round {load}\n", flush=True)


if __name__ == "__main__":
    common.run(main())
