"""The nemesis: a seeded schedule of faults, applied one at a time and always healed."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from dataclasses import dataclass

from tests.campaign.history import History
from tests.campaign.topology import GATEWAY_APPLICATION, Topology

FAULT_KINDS = (
    "kill",
    "stop",
    "pgcut",
    "pgcommit",
    "sendcommit",
    "pgstall",
    "pgrestart",
    "netdelay",
    "redis",
    "pubsub",
    "lease",
    "failover",
)
CLUSTER_ONLY = ("failover",)
# A send's text as its transaction binds it (the queued item's text, the message's parts), not
# the demo agent's echo of it ("You said: note m-c0-1"), which a worker's step commit binds;
# an unkeyed send's text begins "unkeyed" (clients.py).
SEND_TEXT = re.compile(rb"(?<!said: )(?<!unkeyed )(?:unkeyed )?(?:note|email) m-c\d+-\d+")
UNKEYED_SEND_TEXT = re.compile(rb"(?<!said: )unkeyed (?:note|email) m-c\d+-\d+")
# The gateways' connections name themselves (topology.py): a worker's writes also bind a send's
# text (a queued item admitted as a message, an email tool's body), and are never aimed at.
GATEWAY = GATEWAY_APPLICATION.encode()


def default_faults(topology: str) -> list[str]:
    """Every fault the topology has (a failover needs a Redis Cluster)."""
    return [k for k in FAULT_KINDS if topology == "cluster" or k not in CLUSTER_ONLY]


@dataclass(frozen=True)
class Strike:
    at: float  # seconds after the start
    kind: str
    target: int  # which process (0-3: gateway, gateway, worker, worker) where it matters
    seconds: float
    forward: bool  # pgcommit, sendcommit: the COMMIT reaches Postgres before the cut (unknown)


def schedule(rng: random.Random, kinds: list[str], minutes: float) -> list[Strike]:
    strikes, at = [], rng.uniform(1.0, 3.0)
    while kinds and at < minutes * 60:
        kind = rng.choice(kinds)
        strikes.append(
            Strike(at, kind, rng.randrange(4), rng.uniform(0.5, 2.5), rng.random() < 0.5)
        )
        at += rng.uniform(2.0, 6.0)
    return strikes


class Nemesis:
    def __init__(self, topology: Topology, history: History, strikes: list[Strike]) -> None:
        self.topology = topology
        self.history = history
        self.strikes = strikes

    async def run(self, started: float, deadline: float) -> None:
        for strike in self.strikes:
            wait = started + strike.at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if time.monotonic() >= deadline:
                return
            await self.strike(strike)

    async def strike(self, s: Strike) -> None:
        top = self.topology
        proxy = top.proxy
        if s.kind in ("kill", "stop"):
            handle = top.processes[s.target]
            name = f"{handle.role}{s.target}"
            if s.kind == "kill":
                self.history.fault("kill", name)
                handle.process.kill()
                await asyncio.to_thread(handle.process.wait, 10)
                await top.restart(s.target)
            else:
                self.history.fault("stop", name, s.seconds)
                await self._freeze(handle.process.pid, s.seconds)
        elif s.kind == "lease":
            # A worker frozen past its lease: the other takes its runs over; thawed, it must
            # write nothing and publish nothing the clients would show.
            index = 2 + s.target % 2
            self.history.fault("lease", f"worker{index}", top.lease_ttl + 1.5)
            await self._freeze(top.processes[index].process.pid, top.lease_ttl + 1.5)
        elif s.kind == "pgcut":
            self.history.fault("pgcut", "postgres")
            proxy.cut_all()
        elif s.kind == "pgcommit":
            self.history.fault("pgcommit", f"forward={s.forward}")
            proxy.cut_at(b"COMMIT", forward=s.forward, after=b"BEGIN")
            await self._sprung(s.seconds * 2)
        elif s.kind == "sendcommit":
            # Aimed at a send (every other one at an unkeyed send, which only its transaction's
            # commit key keeps from appending twice): the COMMIT of the gateway's transaction
            # that binds a send's text is cut, so it retries a send whose outcome it does not know.
            pattern = UNKEYED_SEND_TEXT if s.target % 2 == 0 else SEND_TEXT
            proxy.cut_commit_after(pattern, forward=s.forward, origin=GATEWAY)
            if await self._sprung(s.seconds * 2):
                send = proxy.matched.decode(errors="replace")
                self.history.fault("sendcommit", f"forward={s.forward} {send}")
        elif s.kind == "pgstall":
            self.history.fault("pgstall", "postgres", s.seconds)
            await proxy.stall(s.seconds)
        elif s.kind == "pgrestart":
            # forward: a crash (immediate shutdown, crash recovery), else a fast shutdown.
            if await top.restart_postgres(immediate=s.forward):
                self.history.fault("pgrestart", "crash" if s.forward else "fast")
        elif s.kind == "netdelay":
            latency = s.seconds / 25  # 20-100 ms on every packet to and from Postgres
            self.history.fault("netdelay", f"{latency * 1000:.0f}ms", s.seconds * 2)
            await proxy.delay(s.seconds * 2, latency)
        elif s.kind == "redis":
            self.history.fault("redis", "redis")
            await top.restart_redis()
        elif s.kind == "pubsub":
            killed = await top.kill_pubsub()
            self.history.fault("pubsub", f"{killed} connections")
        elif s.kind == "failover":
            promoted = await top.failover()
            self.history.fault("failover", f"replica {promoted}")

    async def _sprung(self, seconds: float) -> bool:
        """Whether the armed trap fired within `seconds`; disarmed either way."""
        try:
            await asyncio.wait_for(self.topology.proxy.trap_fired.wait(), seconds)
        except TimeoutError:
            return False
        finally:
            self.topology.proxy.disarm()
        return True

    async def _freeze(self, pid: int, seconds: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
