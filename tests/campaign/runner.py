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
# A bound on every client's loop, far beyond what a run reaches (a client takes about 100
# steps a minute; a step that finds nothing to do is quicker).
STEPS_PER_MINUTE = 400
MIN_STEPS = 2000
# The settle ends when nothing is active, or when nothing moved for SETTLE_STILL seconds (what
# is left then is stuck: the checker flags it); while runs still move (a loaded box) it waits
# up to SETTLE_CAP, and what is still moving then is reported as unknown, never as a finding.
SETTLE_STILL = 30.0
SETTLE_CAP = 300.0
CONVERGE_PATIENCE = 30.0  # per session; one still fetching then is unknown, not a violation
ACTIVITY = "SELECT coalesce(sum(version), 0) FROM threads"
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
    unknown: list[str] = field(default_factory=list)  # what a loaded box left undecided
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
            *self._aimed(),
            f"sessions: {len(self.history.frames)}"
            f" frames={sum(len(f) for f in self.history.frames.values())}",
            "streams: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.history.stream_counts().items())),
            f"unknown: {len(self.unknown)}" + "".join(f"\n    {u}" for u in self.unknown),
            f"violations: {len(self.violations)}",
            *self.violations,
        ]
        return "\n".join(lines)

    def _aimed(self) -> list[str]:
        """Which sends the sendcommit faults cut the COMMIT of (unkeyed: a retry only its
        commit key keeps from appending again), and whether that COMMIT reached Postgres."""
        keyed = {
            op.args["marker"]: op.args.get("keyed") for op in self.history.ops if op.kind == "send"
        }
        aimed = []
        for fault in self.history.faults:
            if fault.kind == "sendcommit":
                forward, _, text = fault.target.partition(" ")
                marker = text.split()[-1] if text else ""
                aimed.append(f"{marker} {forward}{'' if keyed.get(marker) else ' unkeyed'}")
        return ["sendcommit: " + ", ".join(aimed)] if aimed else []


def steps_for(minutes: float) -> int:
    return max(MIN_STEPS, int(minutes * STEPS_PER_MINUTE))


def plans(config: Config) -> tuple[dict[str, list[Any]], list[Strike], str]:
    """Every client's steps and the fault schedule, all from the seed alone."""
    steps = {
        f"c{i}": plan(random.Random(f"{config.seed}/client/c{i}"), steps_for(config.minutes))
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
        moving = await settle(top.dsn)
        result.phases["settle"] = time.monotonic() - mark
        checker = Checker(history, await read_committed(top.dsn), config.seed)
        checker.still_moving = moving
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
    result.unknown = checker.unknown


async def settle(dsn: str) -> bool:
    """Until no run is queued or running. False when it ended so, or because nothing moved
    for SETTLE_STILL seconds (stuck: the checker flags it); True when the threads still moved
    at SETTLE_CAP (a loaded box: what is unsettled is unknown)."""
    cap = time.monotonic() + SETTLE_CAP
    conn = await asyncpg.connect(dsn)
    try:
        activity, still_since = None, time.monotonic()
        while time.monotonic() < cap:
            active = await conn.fetchval(
                "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
            )
            stuck = await conn.fetchval(STUCK_QUEUE)
            if active == 0 and stuck == 0:
                return False
            now, moved = time.monotonic(), await conn.fetchval(ACTIVITY)
            if moved != activity:
                activity, still_since = moved, now
            elif now - still_since > SETTLE_STILL:
                return False
            await asyncio.sleep(0.25)
        return True
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
        if session is None:
            checker.unknown.append(f"{client.name}: no session to compare after the settle")
            continue
        try:
            committed = await session.server_snapshot()
        except (AssertionError, TimeoutError) as exc:
            checker.unknown.append(f"{session.name}: no committed snapshot ({exc})")
            continue

        def caught_up(follower: Follower, expected: dict[str, Any] = committed) -> bool:
            return follower.snapshot == expected and follower._fetcher is None

        try:
            await session.wait_for(caught_up, CONVERGE_PATIENCE)
        except (AssertionError, TimeoutError):
            # Still fetching on a loaded box, or its connection failed meanwhile: unknown.
            if session._fetcher is not None or session.broken:
                checker.unknown.append(f"{session.name}: no settled snapshot in time")
                continue
        checker.finals[session.name] = (session.snapshot, committed)
