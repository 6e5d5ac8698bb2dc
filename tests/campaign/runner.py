"""One campaign: topology up, seeded clients and nemesis, settle, check, report."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from tests.campaign.checker import Checker, read_committed
from tests.campaign.clients import Client, plan
from tests.campaign.history import History
from tests.campaign.nemesis import Nemesis, Strike, default_faults, schedule
from tests.campaign.topology import Topology, topology
from tests.e2e import cluster
from tests.e2e.follower import Follower

THREADS = 3
CLIENTS_PER_THREAD = 3
MAX_STEPS = 2000  # a bound on every client's loop, far beyond what a run reaches
SETTLE_TIMEOUT = 90.0
# Queued items with no run of their thread waiting on a person (which legitimately holds them).
STUCK_QUEUE = (
    "SELECT count(*) FROM queued_items q WHERE q.status = 'queued' AND NOT EXISTS"
    " (SELECT 1 FROM runs r WHERE r.thread_id = q.thread_id AND r.status = 'waiting')"
)


@dataclass
class Config:
    seed: int
    minutes: float
    topology: str = "single"
    faults: Sequence[str] | None = None  # None: every fault of the topology

    @property
    def fault_kinds(self) -> list[str]:
        return default_faults(self.topology) if self.faults is None else list(self.faults)


@dataclass
class Result:
    config: Config
    digest: str
    seconds: float = 0.0
    history: History = field(default_factory=History)
    violations: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        ops = self.history.op_counts()
        faults = self.history.fault_counts()
        lines = [
            f"campaign seed={self.config.seed} topology={self.config.topology}"
            f" minutes={self.config.minutes} schedule={self.digest}",
            f"duration: {self.seconds:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
            + ")",
            "operations: " + ", ".join(f"{k}={v}" for k, v in sorted(ops.items())),
            "faults: " + ", ".join(f"{k}={v}" for k, v in sorted(faults.items())),
            f"sessions: {len(self.history.frames)}"
            f" frames={sum(len(f) for f in self.history.frames.values())}",
            "streams: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.history.stream_counts().items())),
            f"violations: {len(self.violations)}",
            *self.violations,
        ]
        return "\n".join(lines)


def plans(config: Config) -> tuple[dict[str, list[Any]], list[Strike], str]:
    """Every client's steps and the fault schedule, all from the seed alone."""
    steps = {
        f"c{i}": plan(random.Random(f"{config.seed}/client/c{i}"), MAX_STEPS)
        for i in range(THREADS * CLIENTS_PER_THREAD)
    }
    strikes = schedule(random.Random(f"{config.seed}/nemesis"), config.fault_kinds, config.minutes)
    digest = hashlib.sha256(repr((sorted(steps.items()), strikes)).encode()).hexdigest()[:16]
    return steps, strikes, digest


async def campaign(config: Config) -> Result:
    steps, strikes, digest = plans(config)
    result = Result(config, digest)
    began = time.monotonic()
    async with topology(config.topology) as top:
        result.phases["start-up"] = time.monotonic() - began
        await play(config, top, steps, strikes, result)
    result.seconds = time.monotonic() - began
    return result


async def play(
    config: Config,
    top: Topology,
    steps: dict[str, list[Any]],
    strikes: list[Strike],
    result: Result,
) -> None:
    history = result.history
    names = sorted(steps, key=lambda n: int(n[1:]))
    subjects = {name: f"user-{name}" for name in names}
    # Minted in this loop, straight to Postgres (the proxy runs in this loop too).
    tokens = await cluster._mint(top.dsn, {s: ("campaign", "user", s) for s in subjects.values()})
    threads: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for index in range(THREADS):
            url = top.gateway_urls()[index % 2][0]
            token = tokens[subjects[names[0]]]
            response = await http.post(
                f"{url}/v1/threads", json={}, headers={"Authorization": f"Bearer {token}"}
            )
            response.raise_for_status()
            threads.append(response.json()["thread"]["id"])
    clients = [
        Client(
            name,
            subjects[name],
            tokens,
            top.gateway_urls,
            index,
            threads,
            threads[index % THREADS],
            history,
            steps[name],
        )
        for index, name in enumerate(names)
    ]
    for client in clients:
        await client.connect()
    started = time.monotonic()
    deadline = started + config.minutes * 60
    nemesis = Nemesis(top, history, strikes)
    try:
        await asyncio.gather(nemesis.run(started, deadline), *(c.run(deadline) for c in clients))
        result.phases["operations"] = time.monotonic() - started
        # Settle: faults healed, every process up, every run ended or waiting on a person.
        top.heal()
        await top.ensure_alive()
        mark = time.monotonic()
        await settle(top.dsn)
        result.phases["settle"] = time.monotonic() - mark
        checker = Checker(history, await read_committed(top.dsn), config.seed)
        mark = time.monotonic()
        await converge(clients, checker)
        result.phases["converge"] = time.monotonic() - mark
    finally:
        for client in clients:
            for session in client.sessions:
                history.frames[session.name] = session.frames_seen()
                history.snapshots[session.name] = session.versions_applied()
            with contextlib.suppress(Exception):
                await client.close_session()
    result.violations = checker.run()


async def settle(dsn: str) -> None:
    """Until no run is queued or running (bounded; the checker flags what is left)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    conn = await asyncpg.connect(dsn)
    try:
        while time.monotonic() < deadline:
            active = await conn.fetchval(
                "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
            )
            stuck = await conn.fetchval(STUCK_QUEUE)
            if active == 0 and stuck == 0:
                return
            await asyncio.sleep(0.25)
    finally:
        await conn.close()


async def converge(clients: list[Client], checker: Checker) -> None:
    """Each client's live session reconnected if broken, then its last snapshot compared with
    the committed one (fetched after the settle, when nothing changes any more)."""
    for client in clients:
        session = client.session
        if session is None or session.broken:
            await client.connect()
            session = client.session
        assert session is not None
        committed = await session.server_snapshot()

        def caught_up(follower: Follower, expected: dict[str, Any] = committed) -> bool:
            return follower.snapshot == expected and follower._fetcher is None

        with contextlib.suppress(AssertionError, TimeoutError):
            await session.wait_for(caught_up, 20)
        checker.finals[session.name] = (session.snapshot, committed)
