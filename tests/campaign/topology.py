"""The campaign's topology: Postgres behind the fault proxy, Redis, two gateways, two workers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from tests.e2e import cluster, harness
from tests.faults.conftest import target, via
from tests.faults.proxy import FaultProxy
from tests.servers import RedisClusterServer, RedisServer
from tests.services import own_postgres, own_redis_cluster, temporary_postgres_database

ROLES = ("gateway", "gateway", "worker", "worker")
LEASE_TTL = 2.0
# The gateways' Postgres connections name themselves, so a fault can aim at theirs alone.
GATEWAY_APPLICATION = "campaign-gateway"


@dataclass
class Topology:
    dsn: str  # direct, for the checker
    proxy: FaultProxy
    running: cluster.Cluster
    redis: RedisServer | RedisClusterServer
    lease_ttl: float = LEASE_TTL

    @property
    def processes(self) -> list[harness.ServerHandle]:
        return self.running.processes

    def gateway_urls(self) -> list[tuple[str, str]]:
        return [(p.url, p.ws_url) for p in self.processes[:2]]

    async def restart(self, index: int) -> None:
        """Start the dead process again on its port (clients reconnect to the same URL)."""
        old = self.processes[index]
        old.stop()

        def again() -> harness.ServerHandle:
            return harness.start(old.role, old.env, old.port, log_dir=self.running.log_dir)

        for _ in range(3):  # its port may linger a moment after the kill
            with contextlib.suppress(RuntimeError):
                self.processes[index] = await asyncio.to_thread(again)
                return
        raise RuntimeError(f"{old.role} on :{old.port} did not come back")

    async def restart_redis(self) -> None:
        """Redis dies (SIGKILL, nothing persisted) and comes back on its port; on a Cluster,
        one master dies and its replica fails over."""
        redis = self.redis
        if isinstance(redis, RedisClusterServer):
            port = redis.master_ports()[0]
            await asyncio.to_thread(redis.kill, port)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(redis.restart, port)
            await asyncio.to_thread(redis.wait_ready)
            return
        process = redis._process
        if process is not None:
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 10)
        await asyncio.to_thread(redis._launch)

    async def restart_postgres(self, immediate: bool) -> bool:
        """Postgres restarted (a fast shutdown, or a crash); False when it is not this run's
        own server (an override), which is then left alone."""
        server = own_postgres()
        if server is None:
            return False
        await asyncio.to_thread(server.restart, immediate)
        return True

    async def kill_pubsub(self) -> int:
        """CLIENT KILL TYPE pubsub on every Redis node: every gateway's subscriptions drop."""
        redis = self.redis
        ports = redis.live_ports() if isinstance(redis, RedisClusterServer) else [redis.port]
        killed = 0
        for port in ports:
            client = aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
            try:
                killed += int(await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))
            finally:
                await client.aclose()
        return killed

    async def failover(self) -> str:
        """A Cluster replica takes over from its master (CLUSTER FAILOVER, no data lost), then
        the cluster settles; the old master becomes its replica."""
        redis = self.redis
        assert isinstance(redis, RedisClusterServer), "failover needs the cluster topology"
        replicas = await asyncio.to_thread(redis.replica_ports)
        if not replicas:
            return "none"
        port = replicas[0]
        await asyncio.to_thread(redis.command, port, "CLUSTER", "FAILOVER")
        await asyncio.to_thread(redis.wait_ready)
        return str(port)

    def heal(self) -> None:
        """Every frozen process thawed (the nemesis heals its own faults; this is the guard)."""
        self.proxy.disarm()
        for handle in self.processes:
            with contextlib.suppress(ProcessLookupError):
                handle.process.send_signal(signal.SIGCONT)

    async def ensure_alive(self) -> None:
        for index, handle in enumerate(self.processes):
            if not handle.alive():
                await self.restart(index)


def named_url(url: str, application: str) -> str:
    """`url` whose connections tell Postgres (and the fault proxy) `application` as their name."""
    return f"{url}{'&' if '?' in url else '?'}application_name={application}"


@contextlib.asynccontextmanager
async def topology(kind: str) -> AsyncIterator[Topology]:
    redis: RedisServer | RedisClusterServer
    if kind == "cluster":
        redis = own_redis_cluster()
        redis_url = redis.address
    else:
        redis = await asyncio.to_thread(RedisServer().start)
        redis_url = redis.address
    async with temporary_postgres_database() as dsn, FaultProxy(*target(dsn)) as proxy:
        extra = {
            "THREADLINE_LEASE_TTL": str(LEASE_TTL),
            "THREADLINE_DEMO_DELAY_MS": "15",
            "THREADLINE_TOKEN_RATE": "1000",
            "THREADLINE_TOKEN_BURST": "1000",
            "THREADLINE_SCOPE_RATE": "1000",
            "THREADLINE_SCOPE_BURST": "1000",
        }
        url = via(dsn, proxy)
        env = cluster.cluster_env(url, redis_url, extra)
        running = cluster.Cluster(env, Path(tempfile.mkdtemp(prefix="threadline-campaign-")))
        named = {"THREADLINE_DATABASE_URL": named_url(url, GATEWAY_APPLICATION)}
        try:
            await asyncio.gather(
                asyncio.to_thread(running.start, ROLES[:2], named),
                asyncio.to_thread(running.start, ROLES[2:]),
            )
            running.processes.sort(key=lambda handle: handle.role != "gateway")  # as in ROLES
            yield Topology(dsn, proxy, running, redis)
        finally:
            for handle in running.processes:
                with contextlib.suppress(ProcessLookupError):
                    handle.process.send_signal(signal.SIGCONT)
            await asyncio.to_thread(running.stop)
            if isinstance(redis, RedisServer):
                redis.stop()
